"""What the layers above ask of each other, as typed Protocols: a backend
(an upstream client, as the data plane and its clusters call it) and one
response of a streamed request.

The protocols' base classes (gateway/protocols/base.py: UpstreamClient)
implement these; the data plane names only these, so it imports no
protocol.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.core.types import InferRequest, InferResponse, ModelMetadata, OperationRequest, RequestContext


@dataclass(slots=True)
class StreamedResponse:
    """One response of a streamed request. ``final``: the upstream said no
    more follow (a unary answer is final; a decoupled upstream may instead
    just end its stream after responses that were not)."""

    response: InferResponse
    final: bool = False


class Backend(Protocol):
    """Speaks an upstream's protocol to one endpoint (or in-process): what
    the data plane calls (gateway.protocols.base.UpstreamClient has the
    documentation of each call and the defaults)."""

    # Operations call_operation answers (names in gateway.core.types).
    operations: frozenset[str]

    @property
    def label(self) -> str: ...

    @property
    def endpoint_label(self) -> str: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def infer(self, request: InferRequest, ctx: RequestContext) -> InferResponse: ...

    def infer_stream(self, request: InferRequest, ctx: RequestContext) -> AsyncIterator[StreamedResponse]: ...

    async def model_metadata(self, model: str, version: str, ctx: RequestContext) -> ModelMetadata: ...

    async def model_ready(self, model: str, version: str, ctx: RequestContext) -> bool: ...

    async def server_ready(self, ctx: RequestContext) -> bool: ...

    def knows_model(self, model: str, version: str) -> bool | None: ...

    def check_request(self, request: InferRequest) -> None: ...

    async def list_models(self, ctx: RequestContext) -> list[str]: ...

    async def health_check(self, ctx: RequestContext) -> bool: ...

    async def call_operation(self, operation: str, request: OperationRequest, ctx: RequestContext) -> Any: ...
