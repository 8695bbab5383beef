"""One error tree for the whole gateway.

Every failure becomes a :class:`GatewayError` carrying an :class:`ErrorKind`.
Backends translate upstream failures into kinds; frontends translate kinds into
their protocol's own error form. Nothing here knows about any transport.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

# Messages travel back to clients; keep them bounded so a hostile payload
# echoed into an error cannot blow up a response or a log line.
MAX_MESSAGE_CHARS = 1024


class ErrorKind(enum.Enum):
    MALFORMED_REQUEST = "malformed_request"  # not parseable as the protocol
    INVALID_INPUT = "invalid_input"  # parseable, but shapes/types/sizes wrong
    MODEL_NOT_FOUND = "model_not_found"  # unknown model or no route for it
    UNSUPPORTED = "unsupported"  # operation or feature not offered
    UNAUTHENTICATED = "unauthenticated"  # missing or wrong credentials
    TOO_LARGE = "too_large"  # over a configured size limit
    OVERLOADED = "overloaded"  # the gateway's own concurrency limit (the client should slow down)
    UPSTREAM_OVERLOADED = "upstream_overloaded"  # an upstream cluster's circuit breaker is open
    NOT_READY = "not_ready"  # model or server known but not ready
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    UPSTREAM_BAD_RESPONSE = "upstream_bad_response"
    INTERNAL = "internal"  # a bug in the gateway


# Kinds that name the gateway's own state. An upstream's answer never
# becomes one: its overload is UPSTREAM_OVERLOADED, its bug a bad response.
GATEWAY_ONLY_KINDS = frozenset({ErrorKind.OVERLOADED, ErrorKind.INTERNAL})

Form = TypeVar("Form", bound=Hashable)


@dataclass(frozen=True, slots=True)
class ErrorTable(Generic[Form]):
    """One protocol's error forms in both directions (its package exports it
    as ``ERRORS``; tests/test_error_tables.py checks every table).

    ``downstream`` is the form its frontend answers for each kind;
    ``upstream`` reads a form an upstream answered as a kind (the codec may
    refine it from a message); ``received`` lists the forms an upstream of
    the protocol can answer, each of which ``upstream`` must read."""

    downstream: Mapping[ErrorKind, Form]
    upstream: Callable[[Form], ErrorKind]
    received: Collection[Form]


def bounded(message: str) -> str:
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 3] + "..."
    return message if message.isascii() else _unicode_text(message)


def is_unicode(text: str) -> bool:
    """False for text holding lone surrogates: a ``"\\ud800"`` escape from
    JSON, or a header's non-UTF-8 bytes as aiohttp decodes them
    (surrogateescape). Every encoder (orjson, protobuf, the access log)
    refuses those."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _unicode_text(message: str) -> str:
    """``message`` with lone surrogates written as escapes."""
    return message if is_unicode(message) else message.encode("utf-8", "backslashreplace").decode("utf-8")


class GatewayError(Exception):
    """A failure with a kind every frontend knows how to encode."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        self.kind = kind
        self.message = bounded(message)
        super().__init__(self.message)

    def __repr__(self) -> str:
        return f"GatewayError({self.kind.name}, {self.message!r})"


class Saturated(GatewayError):
    """The worker's memory budget (limits.max_inflight_bytes) is spent: the
    request is refused at once. The gateway is saturated, not the client too
    fast, so HTTP answers 503 with Retry-After rather than 429; gRPC says
    RESOURCE_EXHAUSTED like any overload."""

    http_status = 503
    retry_after = 1  # seconds: in-flight requests usually finish well within it

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.OVERLOADED, message)


def malformed(message: str) -> GatewayError:
    return GatewayError(ErrorKind.MALFORMED_REQUEST, message)


def invalid(message: str) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_INPUT, message)


def model_not_found(model: str, version: str | None = None) -> GatewayError:
    # Triton's wording: its example clients check the message's start.
    shown = f"'{model}'" if not version else f"'{model}' version '{version}'"
    return GatewayError(ErrorKind.MODEL_NOT_FOUND, f"Request for unknown model: {shown} is not found")


def unsupported(message: str) -> GatewayError:
    return GatewayError(ErrorKind.UNSUPPORTED, message)


def too_large(message: str) -> GatewayError:
    return GatewayError(ErrorKind.TOO_LARGE, message)


# How an upstream call failed, when a backend can tell. Retries and outlier
# detection read it (gateway/dataplane/retry.py); clients only ever see the kind.
CONNECT_FAILURE = "connect-failure"  # the request never reached the upstream
CONNECTION_RESET = "reset"  # the connection broke before the answer came


class UpstreamFailure(GatewayError):
    """An upstream failure that says how it failed, e.g. a refused connection
    (always safe to retry) versus an answered 503."""

    def __init__(self, kind: ErrorKind, message: str, reason: str) -> None:
        super().__init__(kind, message)
        self.reason = reason


def connect_failure(upstream: str, detail: str) -> UpstreamFailure:
    return UpstreamFailure(ErrorKind.UPSTREAM_UNAVAILABLE, f"cannot connect to upstream {upstream}: {detail}",
                           CONNECT_FAILURE)


def connection_reset(upstream: str, detail: str) -> UpstreamFailure:
    return UpstreamFailure(ErrorKind.UPSTREAM_UNAVAILABLE, f"connection to upstream {upstream} broke: {detail}",
                           CONNECTION_RESET)
