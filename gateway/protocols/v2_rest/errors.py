"""V2 REST's error table, both directions: the HTTP status the frontend
answers for each kind, and what an upstream's status means. Upstream
statuses are never passed through blindly (docs/architecture.md, "Errors")."""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from types import MappingProxyType

from gateway.core.errors import ErrorKind, ErrorTable

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

# What the frontend's own answers stand for when no handler noted an error
# (metrics' outcome), and the kind of aiohttp's refusals (unknown path,
# method): STATUS_OF_KIND read backwards, one kind per status.
KIND_OF_HTTP_STATUS: Mapping[int, ErrorKind] = MappingProxyType({
    400: ErrorKind.MALFORMED_REQUEST, 401: ErrorKind.UNAUTHENTICATED, 404: ErrorKind.MODEL_NOT_FOUND,
    405: ErrorKind.UNSUPPORTED, 413: ErrorKind.TOO_LARGE, 429: ErrorKind.OVERLOADED, 500: ErrorKind.INTERNAL,
    501: ErrorKind.UNSUPPORTED, 502: ErrorKind.UPSTREAM_BAD_RESPONSE, 503: ErrorKind.UPSTREAM_UNAVAILABLE,
    504: ErrorKind.UPSTREAM_TIMEOUT,
})

# An upstream's status as a kind; any other error status means the upstream
# misbehaved (UPSTREAM_BAD_RESPONSE).
KIND_OF_UPSTREAM_STATUS: Mapping[int, ErrorKind] = MappingProxyType({
    400: ErrorKind.INVALID_INPUT,
    401: ErrorKind.UPSTREAM_BAD_RESPONSE,  # it refused the gateway's credential: not the client's problem
    404: ErrorKind.MODEL_NOT_FOUND,
    413: ErrorKind.TOO_LARGE,
    422: ErrorKind.INVALID_INPUT,  # MLServer's validation errors
    429: ErrorKind.UPSTREAM_OVERLOADED,  # the upstream's own limit, not the gateway's listener (OVERLOADED)
    500: ErrorKind.UPSTREAM_BAD_RESPONSE,  # its bug, to the gateway a bad answer
    501: ErrorKind.UNSUPPORTED,
    502: ErrorKind.UPSTREAM_UNAVAILABLE,  # a proxy in front of it could not reach it
    503: ErrorKind.UPSTREAM_UNAVAILABLE,
    504: ErrorKind.UPSTREAM_TIMEOUT,
})


def kind_of_upstream_status(status: int) -> ErrorKind:
    return KIND_OF_UPSTREAM_STATUS.get(status, ErrorKind.UPSTREAM_BAD_RESPONSE)


ERRORS = ErrorTable(STATUS_OF_KIND, kind_of_upstream_status, frozenset(s.value for s in HTTPStatus if s >= 400))
