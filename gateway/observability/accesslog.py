"""One access-log line per request, plain (key=value) or JSON.

Lines are formatted on the event loop and written by a
:class:`~gateway.logwriter.LineWriter` thread: a sink that does not take
them (a pipe nobody reads) costs dropped, counted lines, never serving. Each
``write(2)`` carries whole lines, at most PIPE_BUF bytes, so several worker
processes sharing stdout never interleave inside a line. Only bounded
identifiers from the :class:`~gateway.observe.RequestRecord` are written:
never tensor data, never header values other than the request id and trace
id.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.config.observability import AccessLogConfig
from gateway.core.record import RequestRecord, overhead_seconds, trace_id
from gateway.core.types import RequestContext
from gateway.observability.logwriter import ACCESS_LOG_BUSY_LINGER, ACCESS_LOG_LINGER, LineWriter

# Longest error text and path a line carries.
MAX_ERROR_CHARS = 300
MAX_PATH_CHARS = 256
# Lines waiting for the sink: past this, new lines are dropped (counted).
# About 1,200 typical lines; a sink that keeps up never lets it fill.
MAX_QUEUED_BYTES = 512 * 1024
# Seconds a stopping gateway waits for the sink to take the queued lines.
CLOSE_TIMEOUT = 2.0
_SAFE_PLAIN = re.compile(r"[A-Za-z0-9._:/@\[\]#*+,%-]+")
# A plain line's fields up to response_bytes, in the order of AccessLog.fields.
_PLAIN_LINE = " ".join(f"{name}=%s" for name in (
    "ts", "request_id", "trace_id", "listener", "protocol", "peer", "method", "path", "operation", "model",
    "version", "route", "upstream", "endpoint", "attempts", "status", "outcome", "duration_ms", "upstream_ms",
    "overhead_ms", "decode_ms", "encode_ms", "request_bytes", "response_bytes"))


# orjson escapes C0 controls only: these other line breaks (str.splitlines,
# Unicode-aware readers) would stay raw in its UTF-8 and split a line.
_RAW_BREAKS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))


def _valid_text(value: Any) -> Any:
    """``value`` (a string, or a dict of fields) with lone surrogates
    (undecodable bytes of a path) written as ``\\udcff`` escapes."""
    if isinstance(value, dict):
        return {key: _valid_text(item) for key, item in value.items()}
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def _json(value: Any) -> bytes:
    """``value`` as one line of JSON: every character a reader may take for
    a line break escaped. The cost is a C check, unless a non-ASCII byte is
    present."""
    try:
        data = orjson.dumps(value)
    except orjson.JSONEncodeError:  # a lone surrogate
        data = orjson.dumps(_valid_text(value))
    if not data.isascii():
        for raw, escaped in _RAW_BREAKS:
            data = data.replace(raw, escaped)
    return data


def _plain(fields: dict[str, Any]) -> bytes:
    """``key=value`` pairs; a string with anything but safe characters is
    JSON-quoted, so a newline or quote in a model name cannot forge a line."""
    parts, texts = [], []
    for key, value in fields.items():
        if isinstance(value, str):
            if not value:
                value = "-"
            else:
                texts.append(value)
        parts.append(f"{key}={value}")
    if _SAFE_PLAIN.fullmatch("/".join(texts)):  # the usual line: one check for all its strings
        return (" ".join(parts) + "\n").encode()
    parts = []
    for key, value in fields.items():
        if isinstance(value, str) and not _SAFE_PLAIN.fullmatch(value):
            value = _json(value).decode() if value else "-"
        parts.append(f"{key}={value}")
    return (" ".join(parts) + "\n").encode()


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def _ms_text(seconds: float) -> str:
    """``str(_ms(seconds))`` at half the cost: both are the correctly
    rounded three decimals, without trailing zeros (below 1e15 ms, where
    repr has no exponent and no two such decimals share a double)."""
    ms = seconds * 1000.0
    if not -1e15 < ms < 1e15:  # and NaN
        return str(round(ms, 3))
    text = f"{ms:.3f}"
    text = text.rstrip("0")
    return text + "0" if text[-1] == "." else text


class _Clock:
    """RFC 3339 UTC timestamps with milliseconds; the seconds part is
    formatted once per second, not once per line."""

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def format(self, now: float) -> str:
        second = int(now)
        if second != self._second:
            self._second, self._prefix = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{int((now - second) * 1000):03d}Z"


class AccessLog:
    """Writes access-log lines to a file descriptor (through a writer thread).

    ``path``: the file ``fd`` was opened from, reopened by :meth:`reopen`.
    ``on_drop(n)``: called for every ``n`` lines lost (queue full, failed
    write), from the event loop or the writer thread.
    """

    def __init__(self, fd: int | None, fmt: str = "plain", worker: int | None = None, owns_fd: bool = False,
                 path: str | None = None, on_drop: Callable[[int], None] | None = None) -> None:
        self.fd = fd
        self.format = fmt
        self.worker = worker
        self._clock = _Clock()
        self._writer = None if fd is None else LineWriter(
            fd, path=path, owns_fd=owns_fd, max_bytes=MAX_QUEUED_BYTES, name="access log writer", on_drop=on_drop,
            linger=ACCESS_LOG_LINGER, busy_linger=ACCESS_LOG_BUSY_LINGER)

    @classmethod
    def open(cls, config: AccessLogConfig, worker: int | None = None,
             on_drop: Callable[[int], None] | None = None) -> AccessLog:
        if not config.enabled:
            return cls(None)
        if config.destination in ("stdout", "stderr"):
            return cls(1 if config.destination == "stdout" else 2, config.format, worker, on_drop=on_drop)
        fd = os.open(config.destination, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return cls(fd, config.format, worker, owns_fd=True, path=config.destination, on_drop=on_drop)

    @property
    def enabled(self) -> bool:
        return self.fd is not None

    @property
    def dropped(self) -> int:
        """Lines lost: the queue was full (a stuck sink) or a write failed."""
        return self._writer.dropped if self._writer is not None else 0

    def fields(self, ctx: RequestContext, duration: float, now: float) -> dict[str, Any]:
        r: RequestRecord = ctx.record
        fields: dict[str, Any] = {
            "ts": self._clock.format(now),
            "request_id": ctx.request_id,
            "trace_id": trace_id(ctx.traceparent),
            "listener": ctx.listener,
            "protocol": ctx.protocol,
            "peer": r.peer,
            "method": r.method,
            "path": r.path[:MAX_PATH_CHARS],
            "operation": r.operation,
            "model": r.model[:MAX_PATH_CHARS],
            "version": r.version[:MAX_PATH_CHARS],
            "route": r.route,
            "upstream": r.upstream,
            "endpoint": r.endpoint,
            "attempts": r.upstream_attempts,
            "status": r.status,
            "outcome": r.outcome,
            "duration_ms": _ms(duration),
            "upstream_ms": _ms(r.upstream_seconds),
            "overhead_ms": _ms(overhead_seconds(r, duration)),
            "decode_ms": _ms(r.decode_seconds),
            "encode_ms": _ms(r.encode_seconds),
            "request_bytes": r.request_bytes,
            "response_bytes": r.response_bytes,
        }
        if self.worker is not None:
            fields["worker"] = self.worker
        if r.passthrough:
            fields["passthrough"] = r.passthrough
        if r.batch_id:
            fields["batch"] = r.batch_id
        if r.error:
            fields["error"] = r.error[:MAX_ERROR_CHARS]
        return fields

    def format_line(self, ctx: RequestContext, duration: float, now: float) -> bytes:
        if self.format == "json":
            return _json(self.fields(ctx, duration, now)) + b"\n"
        return self._plain_line(ctx, duration, now)

    def _plain_line(self, ctx: RequestContext, duration: float, now: float) -> bytes:
        """What ``_plain(self.fields(...))`` gives, in one formatting step
        when every string is safe as it is (the usual line): no dictionary,
        no pair per field."""
        r: RequestRecord = ctx.record
        strings = (ctx.request_id, trace_id(ctx.traceparent), ctx.listener, ctx.protocol, r.peer, r.method,
                   r.path[:MAX_PATH_CHARS], r.operation, r.model[:MAX_PATH_CHARS], r.version[:MAX_PATH_CHARS],
                   r.route, r.upstream, r.endpoint, r.status, r.outcome, r.passthrough, r.batch_id,
                   r.error[:MAX_ERROR_CHARS])
        try:
            safe = _SAFE_PLAIN.fullmatch("/".join(strings)) is not None
        except TypeError:  # a value that is no string: the general path formats it
            safe = False
        if not safe:
            return _plain(self.fields(ctx, duration, now))
        (request_id, trace, listener, protocol, peer, method, path, operation, model, version, route, upstream,
         endpoint, status, outcome, passthrough, batch, error) = strings
        line = _PLAIN_LINE % (
            self._clock.format(now), request_id or "-", trace or "-", listener or "-", protocol or "-",
            peer or "-", method or "-", path or "-", operation or "-", model or "-", version or "-",
            route or "-", upstream or "-", endpoint or "-", r.upstream_attempts, status or "-", outcome or "-",
            _ms_text(duration), _ms_text(r.upstream_seconds), _ms_text(overhead_seconds(r, duration)),
            _ms_text(r.decode_seconds),
            _ms_text(r.encode_seconds), r.request_bytes, r.response_bytes)
        if self.worker is not None:
            line += f" worker={self.worker}"
        if passthrough:
            line += f" passthrough={passthrough}"
        if batch:
            line += f" batch={batch}"
        if error:
            line += f" error={error}"
        return (line + "\n").encode()

    def write(self, ctx: RequestContext, duration: float) -> None:
        """Queue the request's line; never waits for the sink."""
        if self._writer is None or self.fd is None:
            return
        self._writer.put(self.format_line(ctx, duration, time.time()))

    def reopen(self) -> None:
        """Reopen a file destination by its path (SIGUSR1, after logrotate
        moved the file); done by the writer thread. Nothing for stdout/stderr."""
        if self._writer is not None:
            self._writer.reopen()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Write the queued lines, waiting at most ``timeout`` seconds for
        the sink; lines it does not take by then are dropped (counted)."""
        if self._writer is not None:
            self._writer.close(timeout)
        self.fd = None
