"""OpenAI's error table, both directions. An error is ``{"error":
{"message", "type", "param", "code"}}`` with an HTTP status: the status is
the form, ``type`` follows from it (:data:`TYPE_OF_STATUS`). An upstream's
4xx stays the client's error and its 5xx the upstream's (never passed
through blindly; docs/architecture.md, "Errors")."""

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

# The error's ``type`` by status, OpenAI's names; other statuses: server_error.
TYPE_OF_STATUS: Mapping[int, str] = MappingProxyType({
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
    501: "invalid_request_error",
})

# The error's ``code`` by kind, where OpenAI has one (else null).
CODE_OF_KIND: Mapping[ErrorKind, str] = MappingProxyType({
    ErrorKind.MODEL_NOT_FOUND: "model_not_found",
    ErrorKind.TOO_LARGE: "request_too_large",
    ErrorKind.OVERLOADED: "rate_limit_exceeded",
})

# What the listener's own answers stand for when no handler noted an error
# (metrics' outcome), and the kind of aiohttp's refusals (unknown path,
# method): STATUS_OF_KIND read backwards, one kind per status.
KIND_OF_HTTP_STATUS: Mapping[int, ErrorKind] = MappingProxyType({
    400: ErrorKind.MALFORMED_REQUEST, 401: ErrorKind.UNAUTHENTICATED, 404: ErrorKind.MODEL_NOT_FOUND,
    405: ErrorKind.UNSUPPORTED, 413: ErrorKind.TOO_LARGE, 429: ErrorKind.OVERLOADED, 500: ErrorKind.INTERNAL,
    501: ErrorKind.UNSUPPORTED, 502: ErrorKind.UPSTREAM_BAD_RESPONSE, 503: ErrorKind.UPSTREAM_UNAVAILABLE,
    504: ErrorKind.UPSTREAM_TIMEOUT,
})

# An upstream's status as a kind. Other 4xx: the request's fault
# (INVALID_INPUT); other 5xx: the upstream misbehaved.
KIND_OF_UPSTREAM_STATUS: Mapping[int, ErrorKind] = MappingProxyType({
    401: ErrorKind.UPSTREAM_BAD_RESPONSE,  # it refused the gateway's API key: not the client's problem
    403: ErrorKind.UPSTREAM_BAD_RESPONSE,
    404: ErrorKind.MODEL_NOT_FOUND,
    413: ErrorKind.TOO_LARGE,
    429: ErrorKind.UPSTREAM_OVERLOADED,  # the upstream's own limit, not the gateway's listener (OVERLOADED)
    501: ErrorKind.UNSUPPORTED,
    502: ErrorKind.UPSTREAM_UNAVAILABLE,  # a proxy in front of it could not reach it
    503: ErrorKind.UPSTREAM_UNAVAILABLE,
    504: ErrorKind.UPSTREAM_TIMEOUT,
})


def kind_of_upstream_status(status: int) -> ErrorKind:
    kind = KIND_OF_UPSTREAM_STATUS.get(status)
    if kind is not None:
        return kind
    return ErrorKind.INVALID_INPUT if 400 <= status < 500 else ErrorKind.UPSTREAM_BAD_RESPONSE


ERRORS = ErrorTable(STATUS_OF_KIND, kind_of_upstream_status, frozenset(s.value for s in HTTPStatus if s >= 400))
