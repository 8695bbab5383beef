"""V1 REST's error table, both directions. V1 errors are ``{"error":
"..."}`` with an HTTP status: the status is the form, the statuses those of
every JSON-over-HTTP inference API (gateway/core/httpstatus.py). An upstream's 4xx
stays the client's error and its 5xx the upstream's (never passed through
blindly; docs/architecture.md, "Errors")."""

from __future__ import annotations

from gateway.core.errors import ErrorTable
from gateway.core.httpstatus import (
    ERROR_STATUSES,
    KIND_OF_HTTP_STATUS,
    KIND_OF_UPSTREAM_STATUS,
    STATUS_OF_KIND,
    kind_of_upstream_status,
)

__all__ = ["ERRORS", "KIND_OF_HTTP_STATUS", "KIND_OF_UPSTREAM_STATUS", "STATUS_OF_KIND", "kind_of_upstream_status"]

ERRORS = ErrorTable(STATUS_OF_KIND, kind_of_upstream_status, ERROR_STATUSES)
