"""Server-Sent Events (the WHATWG HTML standard's ``text/event-stream``):
what the gateway writes to a client that asked for a stream over HTTP."""

from __future__ import annotations

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"


def encode_event(data: bytes) -> bytes:
    """One event carrying ``data`` (UTF-8 text): a ``data:`` line per line
    of it, ended by a blank line. JSON from orjson has no line breaks, so an
    event is ``data: {...}\\n\\n``."""
    if b"\n" not in data and b"\r" not in data:
        return b"data: " + data + b"\n\n"
    lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    return b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"
