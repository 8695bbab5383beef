"""Contexts for calls made on the side of a request."""

from __future__ import annotations

import dataclasses

from gateway.core.record import RequestRecord
from gateway.core.types import RequestContext


def side_context(ctx: RequestContext) -> RequestContext:
    """A copy of ``ctx`` with its own record and deadline, for upstream calls
    made beside the request (a readiness probe, a configuration lookup):
    they must not count as the request's own upstream time (statistics,
    metrics) nor move its deadline."""
    return dataclasses.replace(ctx, record=RequestRecord())
