"""V2 REST's error table, both directions: the HTTP status the frontend
answers for each kind (those of every JSON-over-HTTP inference API:
gateway/core/httpstatus.py), and what an upstream's status means (its own
reading: V2 servers answer 400 and 422 for the request's fault, 500 for their bug). Upstream
statuses are never passed through blindly (docs/architecture.md, "Errors")."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gateway.core.errors import ErrorKind, ErrorTable
from gateway.core.httpstatus import ERROR_STATUSES, KIND_OF_HTTP_STATUS, STATUS_OF_KIND

__all__ = ["ERRORS", "KIND_OF_HTTP_STATUS", "KIND_OF_UPSTREAM_STATUS", "STATUS_OF_KIND", "kind_of_upstream_status"]

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


ERRORS = ErrorTable(STATUS_OF_KIND, kind_of_upstream_status, ERROR_STATUSES)
