"""V1 REST's error table (KServe V1 / TF Serving answer ``{"error": ...}``
with an HTTP status). Upstream statuses are read by kind, never passed on:
a 4xx stays the client's error, a 5xx is the upstream's."""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from types import MappingProxyType

from gateway.errors import ErrorKind, ErrorTable

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

# A V1 server's status as a kind. Other 4xx: the request's fault
# (INVALID_INPUT); other 5xx: the server misbehaved (UPSTREAM_BAD_RESPONSE).
KIND_OF_UPSTREAM_STATUS: Mapping[int, ErrorKind] = MappingProxyType({
    401: ErrorKind.UPSTREAM_BAD_RESPONSE,  # it refused the gateway's credential: not the client's problem
    403: ErrorKind.UPSTREAM_BAD_RESPONSE,
    404: ErrorKind.MODEL_NOT_FOUND,  # KServe's ModelNotFound; TF Serving's unknown model or version
    413: ErrorKind.TOO_LARGE,
    429: ErrorKind.UPSTREAM_OVERLOADED,  # the upstream's own limit, not the gateway's listener
    501: ErrorKind.UNSUPPORTED,  # e.g. KServe's :explain of a model without an explainer
    502: ErrorKind.UPSTREAM_UNAVAILABLE,  # a proxy in front of it could not reach it
    503: ErrorKind.UPSTREAM_UNAVAILABLE,  # KServe's ModelNotReady / ServerNotReady
    504: ErrorKind.UPSTREAM_TIMEOUT,
})


def kind_of_upstream_status(status: int) -> ErrorKind:
    if status in KIND_OF_UPSTREAM_STATUS:
        return KIND_OF_UPSTREAM_STATUS[status]
    return ErrorKind.INVALID_INPUT if 400 <= status < 500 else ErrorKind.UPSTREAM_BAD_RESPONSE


ERRORS = ErrorTable(STATUS_OF_KIND, kind_of_upstream_status, frozenset(s.value for s in HTTPStatus if s >= 400))
