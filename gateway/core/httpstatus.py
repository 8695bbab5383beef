"""The HTTP statuses of the JSON-over-HTTP inference APIs (V2 REST, KServe
V1, OpenAI's): they agree on what each error kind answers and on what an
answer's status stands for, so the tables live here once and each
protocol's errors.py names them (with its own reading of an upstream's
status where it differs)."""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from types import MappingProxyType

from gateway.core.errors import ErrorKind

STATUS_OF_KIND: Mapping[ErrorKind, int] = MappingProxyType({
    ErrorKind.MALFORMED_REQUEST: 400,
    ErrorKind.INVALID_INPUT: 400,
    ErrorKind.MODEL_NOT_FOUND: 404,
    ErrorKind.UNSUPPORTED: 501,
    ErrorKind.UNAUTHENTICATED: 401,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.OVERLOADED: 429,
    ErrorKind.UPSTREAM_OVERLOADED: 503,
    ErrorKind.NOT_READY: 503,
    ErrorKind.UPSTREAM_UNAVAILABLE: 503,
    ErrorKind.UPSTREAM_TIMEOUT: 504,
    ErrorKind.UPSTREAM_BAD_RESPONSE: 502,
    ErrorKind.INTERNAL: 500,
})

# What a listener's own answers stand for when no handler noted an error
# (metrics' outcome), and the kind of aiohttp's refusals (unknown path,
# method): STATUS_OF_KIND read backwards, one kind per status.
KIND_OF_HTTP_STATUS: Mapping[int, ErrorKind] = MappingProxyType({
    400: ErrorKind.MALFORMED_REQUEST, 401: ErrorKind.UNAUTHENTICATED, 404: ErrorKind.MODEL_NOT_FOUND,
    405: ErrorKind.UNSUPPORTED, 413: ErrorKind.TOO_LARGE, 429: ErrorKind.OVERLOADED, 500: ErrorKind.INTERNAL,
    501: ErrorKind.UNSUPPORTED, 502: ErrorKind.UPSTREAM_BAD_RESPONSE, 503: ErrorKind.UPSTREAM_UNAVAILABLE,
    504: ErrorKind.UPSTREAM_TIMEOUT,
})

# An upstream's status as a kind, where the APIs agree. Other 4xx: the
# request's fault (INVALID_INPUT); other 5xx: the upstream misbehaved.
KIND_OF_UPSTREAM_STATUS: Mapping[int, ErrorKind] = MappingProxyType({
    401: ErrorKind.UPSTREAM_BAD_RESPONSE,  # it refused the gateway's credential: not the client's problem
    403: ErrorKind.UPSTREAM_BAD_RESPONSE,
    404: ErrorKind.MODEL_NOT_FOUND,
    413: ErrorKind.TOO_LARGE,
    429: ErrorKind.UPSTREAM_OVERLOADED,  # the upstream's own limit, not the gateway's listener (OVERLOADED)
    501: ErrorKind.UNSUPPORTED,
    502: ErrorKind.UPSTREAM_UNAVAILABLE,  # a proxy in front of it could not reach it
    503: ErrorKind.UPSTREAM_UNAVAILABLE,
    504: ErrorKind.UPSTREAM_TIMEOUT,
})

# Every error status an upstream may answer (each must read as a kind).
ERROR_STATUSES = frozenset(s.value for s in HTTPStatus if s >= 400)


def kind_of_upstream_status(status: int) -> ErrorKind:
    kind = KIND_OF_UPSTREAM_STATUS.get(status)
    if kind is not None:
        return kind
    return ErrorKind.INVALID_INPUT if 400 <= status < 500 else ErrorKind.UPSTREAM_BAD_RESPONSE
