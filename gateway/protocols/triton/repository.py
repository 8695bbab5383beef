"""The repository index: every model a listener can reach, with its state.

Models come from the data plane's ``list_models`` (names routes spell out,
plus what upstreams behind catch-all routes can list: the builtin models,
UM-Bridge ``/Info``, a V2 server's own repository index). Each is then asked
for readiness through its route, a few at a time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gateway.core.errors import GatewayError
from gateway.core.types import RequestContext
from gateway.protocols.base import DataPlaneApi
from gateway.protocols.triton.context import side_context

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
MAX_CONCURRENT_PROBES = 16
NOT_READY_REASON = "the upstream reports the model not ready"


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: str = ""  # the gateway routes names; versions are the upstream's
    state: str = READY
    reason: str = ""


async def repository_index(dataplane: DataPlaneApi, ctx: RequestContext, ready_only: bool = False) -> list[IndexEntry]:
    names = await dataplane.list_models(ctx)
    slots = asyncio.Semaphore(MAX_CONCURRENT_PROBES)

    async def probe(name: str) -> IndexEntry:
        async with slots:  # the index request is accounted once, not per model probed
            try:
                ready = await dataplane.model_ready(name, "", side_context(ctx))
            except GatewayError as error:
                return IndexEntry(name, state=UNAVAILABLE, reason=error.message)
        return IndexEntry(name) if ready else IndexEntry(name, state=UNAVAILABLE, reason=NOT_READY_REASON)

    entries = sorted(await asyncio.gather(*(probe(name) for name in names)), key=lambda e: e.name)
    return [e for e in entries if e.state == READY] if ready_only else entries
