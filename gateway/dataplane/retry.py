"""Why an upstream attempt failed, and whether and when to try again.

Pure decisions, no I/O: the data plane (gateway/dataplane/plane.py) runs the loop.
Failure reasons are the words of ``retry.retry_on`` in the config plus
``timeout`` and ``bad-response``, which count for outlier detection only.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator

from gateway.config.routes import RetryPolicy
from gateway.core.errors import CONNECT_FAILURE, CONNECTION_RESET, ErrorKind, GatewayError, UpstreamFailure

UNAVAILABLE = "unavailable"  # the upstream answered "unavailable" (e.g. 503)
PER_TRY_TIMEOUT = "per-try-timeout"
TIMEOUT = "timeout"  # the whole request's deadline passed
BAD_RESPONSE = "bad-response"

# Reasons that count against an endpoint for passive outlier ejection.
ENDPOINT_FAILURES = frozenset({CONNECT_FAILURE, CONNECTION_RESET, UNAVAILABLE, PER_TRY_TIMEOUT, TIMEOUT,
                               BAD_RESPONSE})

_KIND_REASONS = {
    ErrorKind.UPSTREAM_UNAVAILABLE: UNAVAILABLE,
    ErrorKind.UPSTREAM_TIMEOUT: TIMEOUT,
    ErrorKind.UPSTREAM_BAD_RESPONSE: BAD_RESPONSE,
}


def error_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from or during (also ``from None``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _transport_reason(exc: BaseException) -> str | None:
    """Connection-level errors a client let through or chained as a cause
    (the HTTP transport, gateway/transport/http_client/pool.py, names its failures itself)."""
    if isinstance(exc, (ConnectionRefusedError, socket.gaierror)):
        return CONNECT_FAILURE
    if isinstance(exc, ConnectionError):
        return CONNECTION_RESET
    return None


def failure_reason(exc: BaseException) -> str | None:
    """The failure reason of an attempt's exception; None when the upstream
    is not at fault (a bad request, an unknown model, a gateway bug)."""
    if isinstance(exc, UpstreamFailure):
        return exc.reason
    for link in error_chain(exc):
        reason = _transport_reason(link)
        if reason is not None:
            return reason
    if isinstance(exc, GatewayError):
        return _KIND_REASONS.get(exc.kind)
    return None


def backoff_delay(policy: RetryPolicy, retry: int, rng: random.Random) -> float:
    """Full-jitter exponential backoff before retry number ``retry`` (1, 2, ...):
    uniform in [0, min(max_backoff, backoff * 2**(retry-1))]."""
    ceiling = min(policy.max_backoff, policy.backoff * (2 ** (retry - 1)))
    return rng.uniform(0.0, ceiling)


def budget_allows(retries_in_flight: int, active_requests: int, percent: float, min_concurrency: int) -> bool:
    """May one more retry start? Retries in flight stay within ``percent`` of
    the active requests, but ``min_concurrency`` retries are always allowed."""
    allowed = max(min_concurrency, int(active_requests * percent / 100.0))
    return retries_in_flight < allowed
