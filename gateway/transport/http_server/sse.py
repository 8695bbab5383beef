"""Server-sent events (the ``text/event-stream`` format of the HTML
standard): writing them to a client that asked for a stream over HTTP
(:func:`encode_event`), and reading them from an upstream's streamed reply
(:class:`SseParser`).

Lines end with CRLF, LF or CR; ``data:`` lines of one event are joined
with LF; a blank line ends the event; lines starting with ``:`` are
comments; ``event:`` names the event (``message`` when unnamed); other
fields (``id``, ``retry``) are not used here. One event is bounded
(``max_event_bytes``), so a stream that never ends an event cannot grow a
buffer without bound.
"""

from __future__ import annotations

from dataclasses import dataclass

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
_LF, _CR = 10, 13


def encode_event(data: bytes) -> bytes:
    """One event carrying ``data`` (UTF-8 text): a ``data:`` line per line
    of it, ended by a blank line. JSON from orjson has no line breaks, so an
    event is ``data: {...}\\n\\n``."""
    if b"\n" not in data and b"\r" not in data:
        return b"data: " + data + b"\n\n"
    lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    return b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"


class SseError(ValueError):
    """The stream is not readable as events (an event over the bound)."""


@dataclass(frozen=True, slots=True)
class SseEvent:
    event: str  # "message" unless named
    data: bytes  # its data lines joined with LF


class SseParser:
    """Events from a stream fed in chunks of any size."""

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self._buffer = bytearray()  # an unfinished line
        self._skip_lf = False  # the last chunk ended with CR: an LF next belongs to it
        self._data: list[bytes] = []
        self._event = ""
        self._size = 0  # bytes of the event so far

    @property
    def pending(self) -> bool:
        """Whether part of an event was read and not ended (a stream cut short)."""
        return bool(self._data or self._buffer.strip())

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[SseEvent]:
        events: list[SseEvent] = []
        buffer = self._buffer
        buffer += chunk
        start = 0
        if self._skip_lf and buffer[:1] == b"\n":
            start = 1
        self._skip_lf = False
        end = len(buffer)
        while start < end:
            lf = buffer.find(b"\n", start)
            cr = buffer.find(b"\r", start, lf if lf >= 0 else end)
            stop = cr if cr >= 0 else lf
            if stop < 0:
                break
            line = bytes(buffer[start:stop])
            start = stop + 1
            if buffer[stop] == _CR:
                if start < end:
                    start += buffer[start] == _LF
                else:
                    self._skip_lf = True
            self._line(line, events)
        del buffer[:start]
        if self._size + len(buffer) > self.max_event_bytes:
            raise SseError(f"an event over {self.max_event_bytes} bytes")
        return events

    def _line(self, line: bytes, events: list[SseEvent]) -> None:
        if not line:
            if self._data:
                events.append(SseEvent(self._event or "message", b"\n".join(self._data)))
            self._data, self._event, self._size = [], "", 0
            return
        self._size += len(line) + 1
        if self._size > self.max_event_bytes:
            raise SseError(f"an event over {self.max_event_bytes} bytes")
        if line[:1] == b":":
            return
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")


def parse_events(body: bytes | bytearray, max_event_bytes: int) -> list[SseEvent]:
    """Every complete event of a whole body (an unfinished last one is dropped, as the standard says)."""
    return SseParser(max_event_bytes).feed(body)
