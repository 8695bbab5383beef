"""A tiny authoritative DNS server for tests: real DNS over UDP.

``python -m peers.dns_server RECORDS PORT_FILE`` binds 127.0.0.1 port 0,
writes its port to PORT_FILE and answers A / AAAA questions from RECORDS, a
JSON file ``{"name": ["127.0.0.2", ...]}`` read again for every query, so a
test changes the answer by rewriting it. Unknown names get NXDOMAIN. Written
apart from gateway/dataplane/cluster/dnsclient.py (no shared code), so the two check each other.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import struct
import sys
from pathlib import Path


def answer(query: bytes, records: dict[str, list[str]]) -> bytes:
    query_id, flags = struct.unpack_from("!HH", query)
    labels, offset = [], 12
    while query[offset]:
        length = query[offset]
        labels.append(query[offset + 1:offset + 1 + length].decode().lower())
        offset += 1 + length
    qtype, _ = struct.unpack_from("!HH", query, offset + 1)
    question = query[12:offset + 5]
    name = ".".join(labels)
    addresses = records.get(name)
    if addresses is None:
        return struct.pack("!HHHHHH", query_id, 0x8183 | (flags & 0x0100), 1, 0, 0, 0) + question
    family = {1: 4, 28: 6}.get(qtype)
    chosen = [ipaddress.ip_address(a) for a in addresses]
    chosen = [a for a in chosen if a.version == family]
    body = b"".join(b"\xc0\x0c" + struct.pack("!HHIH", qtype, 1, 1, len(a.packed)) + a.packed for a in chosen)
    return struct.pack("!HHHHHH", query_id, 0x8180 | (flags & 0x0100), 1, len(chosen), 0, 0) + question + body


def main() -> int:
    records_path, port_file = Path(sys.argv[1]), Path(sys.argv[2])
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    port_file.write_text(str(sock.getsockname()[1]))
    while True:
        query, peer = sock.recvfrom(4096)
        try:
            records = {k.lower().rstrip("."): v for k, v in json.loads(records_path.read_text()).items()}
            sock.sendto(answer(query, records), peer)
        except (ValueError, IndexError, struct.error, OSError) as exc:  # a half-written file: no answer this time
            print(f"dns_server: {exc!r}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
