"""A small DNS client: A / AAAA queries over UDP to given nameservers.

Used when an upstream's ``dns.nameservers`` is set (docs/routing-and-resilience.md,
DNS discovery); otherwise the system resolver answers (gateway/dataplane/cluster/discovery.py).
Only what address discovery needs (RFC 1035 messages, one question, the
address records of the answer section); names are queried as given, so no
search domains apply: give the fully qualified name.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import struct

TYPE_A = 1
TYPE_AAAA = 28
CLASS_IN = 1
_HEADER = struct.Struct("!HHHHHH")
_RR_FIXED = struct.Struct("!HHIH")  # type, class, ttl, data length
_FLAG_RESPONSE = 0x8000
_FLAG_TRUNCATED = 0x0200
_FLAG_RECURSION_DESIRED = 0x0100
_MAX_POINTER_JUMPS = 32  # a compressed name longer than this is a loop
MAX_MESSAGE = 4096


class DnsError(Exception):
    """No usable answer: a malformed message, an error code or no reply."""


class NotOurReply(DnsError):
    """A datagram that does not answer our query (a stray or late one)."""


def encode_name(name: str) -> bytes:
    labels = name.rstrip(".").split(".") if name.rstrip(".") else []
    out = bytearray()
    for label in labels:
        raw = label.encode("idna") if not label.isascii() else label.encode()
        if not 0 < len(raw) < 64:
            raise DnsError(f"bad DNS label in {name!r}")
        out += bytes([len(raw)]) + raw
    if len(out) + 1 > 255:
        raise DnsError(f"DNS name too long: {name!r}")
    return bytes(out) + b"\0"


def encode_query(query_id: int, name: str, qtype: int) -> bytes:
    """One question, recursion desired."""
    return _HEADER.pack(query_id, _FLAG_RECURSION_DESIRED, 1, 0, 0, 0) + encode_name(name) + struct.pack(
        "!HH", qtype, CLASS_IN)


def _skip_name(message: bytes, offset: int) -> int:
    """The offset after the (possibly compressed) name at ``offset``."""
    while True:
        if offset >= len(message):
            raise DnsError("truncated name")
        length = message[offset]
        if length & 0xC0 == 0xC0:
            return offset + 2  # a pointer ends the name
        if length & 0xC0:
            raise DnsError("bad label type")
        offset += 1 + length
        if length == 0:
            return offset


def read_name(message: bytes, offset: int) -> str:
    labels: list[str] = []
    for _ in range(_MAX_POINTER_JUMPS):
        while True:
            if offset >= len(message):
                raise DnsError("truncated name")
            length = message[offset]
            if length & 0xC0 == 0xC0:
                if offset + 1 >= len(message):
                    raise DnsError("truncated pointer")
                offset = ((length & 0x3F) << 8) | message[offset + 1]
                break
            if length & 0xC0:
                raise DnsError("bad label type")
            if length == 0:
                return ".".join(labels)
            labels.append(message[offset + 1:offset + 1 + length].decode("ascii", "replace"))
            offset += 1 + length
    raise DnsError("name compression loop")


def decode_answer(message: bytes, query_id: int, qtype: int) -> tuple[list[str], int]:
    """(addresses of type ``qtype`` in the answer section, smallest TTL).

    Raises DnsError for a reply that is not the answer to our query or
    carries an error code (NXDOMAIN included: no addresses)."""
    if len(message) < _HEADER.size:
        raise DnsError("short message")
    reply_id, flags, questions, answers, _, _ = _HEADER.unpack_from(message)
    if reply_id != query_id or not flags & _FLAG_RESPONSE:
        raise NotOurReply("not the reply to this query")
    rcode = flags & 0xF
    if rcode:
        raise DnsError({2: "server failure", 3: "no such name", 5: "refused"}.get(rcode, f"rcode {rcode}"))
    offset = _HEADER.size
    for _ in range(questions):
        offset = _skip_name(message, offset) + 4
    addresses: list[str] = []
    ttl_min = 0
    for _ in range(answers):
        offset = _skip_name(message, offset)
        if offset + _RR_FIXED.size > len(message):
            raise DnsError("truncated record")
        rtype, rclass, ttl, length = _RR_FIXED.unpack_from(message, offset)
        offset += _RR_FIXED.size
        data = message[offset:offset + length]
        if len(data) != length:
            raise DnsError("truncated record data")
        offset += length
        if rclass != CLASS_IN or rtype != qtype:
            continue  # CNAMEs on the way: the address records follow them
        if (rtype, length) not in ((TYPE_A, 4), (TYPE_AAAA, 16)):
            raise DnsError("bad address record")
        addresses.append(str(ipaddress.ip_address(data)))
        ttl_min = ttl if len(addresses) == 1 else min(ttl_min, ttl)
    return addresses, ttl_min


class _Exchange(asyncio.DatagramProtocol):
    def __init__(self, query_id: int, qtype: int) -> None:
        self.query_id = query_id
        self.qtype = qtype
        self.result: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: object) -> None:
        if self.result.done():
            return
        try:
            self.result.set_result(decode_answer(data, self.query_id, self.qtype)[0])
        except NotOurReply:
            pass  # keep waiting for ours
        except DnsError as exc:
            self.result.set_exception(exc)

    def error_received(self, exc: Exception) -> None:
        if not self.result.done():
            self.result.set_exception(DnsError(f"nameserver unreachable: {exc}"))


async def query(nameserver: tuple[str, int], name: str, qtype: int, timeout: float) -> list[str]:
    """The addresses of ``name`` from one nameserver, within ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    query_id = random.randrange(1 << 16)
    transport, protocol = await loop.create_datagram_endpoint(lambda: _Exchange(query_id, qtype),
                                                              remote_addr=nameserver)
    try:
        transport.sendto(encode_query(query_id, name, qtype))
        async with asyncio.timeout(timeout):
            return await protocol.result
    except TimeoutError:
        raise DnsError("no reply in time") from None
    finally:
        transport.close()


async def resolve(nameservers: tuple[tuple[str, int], ...], name: str, qtypes: tuple[int, ...],
                  timeout: float) -> list[str]:
    """Addresses of every type in ``qtypes``, asking the nameservers in turn
    (each gets an equal share of ``timeout``) until one answers."""
    share = timeout / max(1, len(nameservers))
    errors: list[str] = []
    for server in nameservers:
        try:
            found: list[str] = []
            for qtype in qtypes:
                found += await query(server, name, qtype, share / len(qtypes))
            return found
        except (DnsError, OSError) as exc:
            errors.append(f"{server[0]}:{server[1]}: {exc}")
    raise DnsError("; ".join(errors) or "no nameserver")
