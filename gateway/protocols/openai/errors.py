"""OpenAI's error table, both directions. An error is ``{"error":
{"message", "type", "param", "code"}}`` with an HTTP status: the status is
the form (the statuses of every JSON-over-HTTP inference API:
gateway/core/httpstatus.py), ``type`` follows from it (:data:`TYPE_OF_STATUS`). An upstream's
4xx stays the client's error and its 5xx the upstream's (never passed
through blindly; docs/architecture.md, "Errors")."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gateway.core.errors import ErrorKind, ErrorTable
from gateway.core.httpstatus import (
    ERROR_STATUSES,
    KIND_OF_HTTP_STATUS,
    KIND_OF_UPSTREAM_STATUS,
    STATUS_OF_KIND,
    kind_of_upstream_status,
)

__all__ = ["CODE_OF_KIND", "ERRORS", "KIND_OF_HTTP_STATUS", "KIND_OF_UPSTREAM_STATUS", "STATUS_OF_KIND",
           "TYPE_OF_STATUS", "kind_of_upstream_status"]

# The error's ``type`` by status, OpenAI's names; other statuses:
# invalid_request_error below 500, server_error from it.
TYPE_OF_STATUS: Mapping[int, str] = MappingProxyType({
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    429: "rate_limit_error", 501: "invalid_request_error",
})

# The error's ``code`` by kind, where OpenAI has one (else null).
CODE_OF_KIND: Mapping[ErrorKind, str] = MappingProxyType({
    ErrorKind.MODEL_NOT_FOUND: "model_not_found",
    ErrorKind.TOO_LARGE: "request_too_large",
    ErrorKind.OVERLOADED: "rate_limit_exceeded",
})

ERRORS = ErrorTable(STATUS_OF_KIND, kind_of_upstream_status, ERROR_STATUSES)
