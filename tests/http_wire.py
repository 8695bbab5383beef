"""One HTTP request over a raw socket, sent exactly as written: no client
normalises its path or merges its headers (tests of what a server does
with such requests)."""

from __future__ import annotations

import socket
from collections.abc import Sequence


def exchange(port: int, method: str, path: str, headers: Sequence[tuple[str, str]] = (), body: bytes = b"",
             version: str = "1.1", timeout: float = 15) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case names, body) of one request on its
    own connection (``Connection: close``: read until the server closes)."""
    head = f"{method} {path} HTTP/{version}\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        data = b""
        for _ in range(100_000):  # bounded; a socket left open times out instead
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head_bytes, _, payload = data.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    answer_headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), answer_headers, payload
