"""What the gateway learns about one request, and how request ids and W3C
trace context are taken from a client and handed on.

A :class:`RequestRecord` rides on every ``RequestContext`` (``ctx.record``).
Frontends, the data plane and upstream clients fill in what they know; when
the response has left, the frontend hands the record once to the metrics and
the access log. This module imports nothing from the gateway, so any layer can
use it.

Propagation contract for upstream clients: send :meth:`upstream_headers` of
the context (``x-request-id``, ``traceparent``, ``tracestate``) as HTTP headers
or gRPC metadata on every upstream call.
"""

from __future__ import annotations

import os
import random
import re
import time
from dataclasses import dataclass
from typing import Any, Literal

REQUEST_ID_HEADER = "x-request-id"
TRACEPARENT_HEADER = "traceparent"
TRACESTATE_HEADER = "tracestate"
# W3C Server Timing: a listener with ``server_timing: true`` reports the
# request's time in the gateway and on its upstream (HTTP header; gRPC trailer).
SERVER_TIMING_HEADER = "server-timing"

# An incoming id is kept only if it is short printable ASCII without spaces:
# it is echoed in headers and written to logs, so it must not be able to
# forge a log line or a header.
MAX_REQUEST_ID_CHARS = 128
_REQUEST_ID = re.compile(rf"^[\x21-\x7e]{{1,{MAX_REQUEST_ID_CHARS}}}$")
# W3C trace context, version 00 (later versions may append fields).
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-[\x21-\x7e]*)?$")
MAX_TRACESTATE_CHARS = 8192
_TRACESTATE = re.compile(r"^[\x20-\x7e]*$")

OUTCOME_OK = "ok"
OUTCOME_CANCELLED = "cancelled"  # the client went away before the answer

# RequestRecord.cache: what a response cache on the route made of the request.
CACHE_HIT = "hit"  # answered from the cache, the upstream not called
CACHE_MISS = "miss"  # not in the cache: sent upstream, its answer stored

# How an upstream client forwarded a same-protocol inference (RequestRecord.passthrough).
PASSTHROUGH_VERBATIM = "verbatim"  # the client's bytes went up, the upstream's bytes came back
PASSTHROUGH_RENAMED = "renamed"  # as verbatim, but the answer's model name/version rewritten (a route rewrite)
PASSTHROUGH_REQUEST_ONLY = "request_only"  # the client's bytes went up; the answer was translated
PASSTHROUGH_TRANSLATED = "translated"  # decoded and re-encoded both ways


# Request ids need to be unique, not secret (a client may choose its own):
# 128 bits of a generator seeded from the OS, a few times cheaper than
# uuid4's os.urandom call, reseeded in a forked child so workers never share a sequence.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def new_request_id() -> str:
    """32 lower-case hex digits, as ``uuid.uuid4().hex``."""
    return _ids.getrandbits(128).to_bytes(16, "big").hex()


def accept_request_id(value: str | None) -> str:
    """The client's request id if it is safe to echo, else a fresh one."""
    if value and _REQUEST_ID.fullmatch(value):
        return value
    return new_request_id()


def accept_traceparent(value: str | None) -> str:
    """A well-formed ``traceparent`` unchanged; anything else is dropped
    (W3C: a malformed traceparent must not be propagated)."""
    if not value or len(value) > 512:
        return ""
    match = _TRACEPARENT.fullmatch(value)
    if match is None or value.startswith("ff") or (value.startswith("00") and len(value) != 55):
        return ""
    if set(match.group(1)) == {"0"} or set(match.group(2)) == {"0"}:
        return ""
    return value


def accept_tracestate(value: str | None, traceparent: str) -> str:
    """``tracestate`` travels only with a valid ``traceparent``."""
    if not traceparent or not value or len(value) > MAX_TRACESTATE_CHARS or not _TRACESTATE.fullmatch(value):
        return ""
    return value


def echo_ids(headers: Any, ctx: Any) -> None:
    """Put the request's id and (validated) trace context on its answer's
    ``headers`` (any mapping), as every HTTP answer carries them."""
    headers[REQUEST_ID_HEADER] = ctx.request_id
    if ctx.traceparent:
        headers[TRACEPARENT_HEADER] = ctx.traceparent
        if ctx.tracestate:
            headers[TRACESTATE_HEADER] = ctx.tracestate


def overhead_seconds(record: RequestRecord, duration: float) -> float:
    """The gateway's own share of ``duration``: everything but the wait on
    the upstream's answers (decoding, translating, encoding, and queueing for
    an upstream slot all count as the gateway's)."""
    return max(duration - record.upstream_seconds, 0.0)


def server_timing(ctx: Any) -> str:
    """``gateway;dur=<ms>, upstream;dur=<ms>`` (W3C Server Timing) of a
    request whose answer is being written now: ``gateway`` is its time so far
    minus the upstream's, so what follows (writing, the metrics) is not in it."""
    upstream = ctx.record.upstream_seconds
    gateway = max(time.monotonic() - ctx.started - upstream, 0.0)
    return f"gateway;dur={gateway * 1000.0:.3f}, upstream;dur={upstream * 1000.0:.3f}"


def trace_id(traceparent: str) -> str:
    return traceparent[3:35] if traceparent else ""


@dataclass(slots=True)
class RequestRecord:
    """Facts about one request for its access-log line and its metrics.

    Every string here ends up as a metric label or in a log line, so only
    bounded identifiers go in: names from the config, protocol status codes,
    error kinds. Never tensor data, never header values other than the ids.
    """

    operation: str = ""  # frontend operation (handler) name, e.g. "infer"
    model: str = ""  # as the client named it
    version: str = ""
    route: str = ""  # route name (default route-<index>), "" when none matched
    upstream: str = ""
    endpoint: str = ""  # last endpoint tried
    status: str = ""  # the protocol's own status: HTTP code (digits: label http_code), gRPC code name (grpc_code)
    outcome: str = ""  # "ok", "cancelled" or an ErrorKind value
    error: str = ""  # bounded GatewayError message
    method: str = ""  # transport details for the log (HTTP method, path)
    path: str = ""
    peer: str = ""
    request_bytes: int = 0
    response_bytes: int = 0
    upstream_seconds: float = 0.0  # summed over upstream attempts
    upstream_attempts: int = 0
    decode_seconds: float = 0.0  # frontend translation: wire -> canonical
    encode_seconds: float = 0.0  # frontend translation: canonical -> wire
    finished: bool = False
    span: Any = None  # the OpenTelemetry server span, when tracing is on
    # Set by the data plane when the request is an inference routed to an
    # upstream: its batch size (gateway.observability.statistics.batch_size).
    batch_size: int | None = None
    # Time spent waiting for an upstream slot (circuit breaker's line), all attempts.
    queue_seconds: float = 0.0
    # One of the PASSTHROUGH_* values, set by upstream clients that can
    # forward a request of their own protocol unchanged; "" otherwise.
    passthrough: str = ""
    # The batch the request rode in upstream (route batching, gateway/dataplane/batching.py); "" when unbatched.
    batch_id: str = ""
    # The response cache's verdict (CACHE_HIT or CACHE_MISS; "" when no cache
    # looked) and its time: the look-up, and on a miss storing the answer.
    cache: str = ""
    cache_seconds: float = 0.0

    def fail(self, kind: str, message: str) -> None:
        """Note the error the client is answered with (first one wins)."""
        if not self.outcome:
            self.outcome = kind
            self.error = message


def finish_request(services: Any, ctx: Any) -> None:
    """Record a finished request once: metrics, then its access-log line.

    ``services`` is the ``GatewayServices`` (``metrics``, ``access_log``),
    ``ctx`` the request's ``RequestContext``. Frontends call this after the
    answer has been written (gRPC: when the call completes), with
    ``ctx.record.status``, ``request_bytes`` and ``response_bytes`` set.
    """
    record: RequestRecord = ctx.record
    if record.finished:
        return
    record.finished = True
    if not record.outcome:
        record.outcome = OUTCOME_OK
    duration = time.monotonic() - ctx.started
    services.metrics.observe_request(ctx.listener, ctx.protocol, record, duration)
    services.statistics.observe(record, duration)
    services.access_log.write(ctx, duration)
    if record.span is not None:
        services.tracing.finish(ctx)


_WORD_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def operation_label(method: str) -> str:
    """A protocol's CamelCase method name as an ``operation`` label, in the
    snake case HTTP frontends' handler names have: ``ApplyJacobian`` ->
    ``apply_jacobian``."""
    return _WORD_BOUNDARY.sub("_", method).lower()


class Translating:
    """``with Translating(ctx.record, "decode"):`` adds the block's time to
    the record's ``decode_seconds`` (``"encode"``: ``encode_seconds``), which
    the metrics report as the frontend's translation time."""

    __slots__ = ("_decode", "_record", "_started")

    def __init__(self, record: RequestRecord, stage: Literal["decode", "encode"]) -> None:
        self._record = record
        self._decode = stage == "decode"
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self._started
        if self._decode:
            self._record.decode_seconds += elapsed
        else:
            self._record.encode_seconds += elapsed
