"""One access-log line per request, plain (key=value) or JSON.

Lines are written with a single ``os.write`` on a file descriptor, so
several worker processes sharing stdout never interleave inside a line (a
pipe write of up to PIPE_BUF bytes is atomic). Only bounded identifiers from
the :class:`~gateway.observe.RequestRecord` are written: never tensor data,
never header values other than the request id and trace id.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import orjson

from gateway.config import AccessLogConfig
from gateway.observe import RequestRecord, trace_id
from gateway.types import RequestContext

log = logging.getLogger(__name__)

# Longest error text and path a line carries.
MAX_ERROR_CHARS = 300
MAX_PATH_CHARS = 256
_SAFE_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/@[]#*+,%")


def _plain_value(value: Any) -> str:
    if isinstance(value, str):
        if value and all(c in _SAFE_PLAIN for c in value):
            return value
        return orjson.dumps(value).decode() if value else '""'  # quoted, escaped: no forged lines
    return str(value)


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def _timestamp(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


class AccessLog:
    """Writes access-log lines to a file descriptor it may own."""

    def __init__(self, fd: int | None, fmt: str = "plain", worker: int | None = None, owns_fd: bool = False) -> None:
        self.fd = fd
        self.format = fmt
        self.worker = worker
        self._owns_fd = owns_fd
        self.dropped = 0  # lines lost to write errors (a full disk must not fail requests)

    @classmethod
    def open(cls, config: AccessLogConfig, worker: int | None = None) -> AccessLog:
        if not config.enabled:
            return cls(None)
        if config.destination in ("stdout", "stderr"):
            return cls(1 if config.destination == "stdout" else 2, config.format, worker)
        fd = os.open(config.destination, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return cls(fd, config.format, worker, owns_fd=True)

    @property
    def enabled(self) -> bool:
        return self.fd is not None

    def fields(self, ctx: RequestContext, duration: float, now: float) -> dict[str, Any]:
        r: RequestRecord = ctx.record
        fields: dict[str, Any] = {
            "ts": _timestamp(now),
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
            "decode_ms": _ms(r.decode_seconds),
            "encode_ms": _ms(r.encode_seconds),
            "request_bytes": r.request_bytes,
            "response_bytes": r.response_bytes,
        }
        if self.worker is not None:
            fields["worker"] = self.worker
        if r.error:
            fields["error"] = r.error[:MAX_ERROR_CHARS]
        return fields

    def format_line(self, ctx: RequestContext, duration: float, now: float) -> bytes:
        fields = self.fields(ctx, duration, now)
        if self.format == "json":
            return orjson.dumps(fields) + b"\n"
        text = " ".join(f"{key}={_plain_value(value) if value != '' else '-'}" for key, value in fields.items())
        return text.encode() + b"\n"

    def write(self, ctx: RequestContext, duration: float) -> None:
        if self.fd is None:
            return
        line = self.format_line(ctx, duration, time.time())
        try:
            os.write(self.fd, line)
        except OSError as exc:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("access log write failed (%s); counting dropped lines", exc)

    def close(self) -> None:
        if self._owns_fd and self.fd is not None:
            os.close(self.fd)
        self.fd = None
