"""An in-process fake upstream client for unit tests of the resilience logic.

Used where the thing under test is pure decision logic (load balancing,
ejection timing, retry and budget arithmetic): each fake endpoint is told
how to behave and counts what it saw. Tests over real sockets use
``peers/echo_upstream.py`` instead.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from gateway.config.node import Node
from gateway.core.types import InferRequest, InferResponse, ModelMetadata, RequestContext, Tensor
from gateway.protocols.base import UpstreamClient


class FakeClient(UpstreamClient):
    @classmethod
    def parse_options(cls, node: Node) -> Any:
        return None

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.calls = 0
        self.delay = 0.0
        self.failures: list[BaseException] = []  # raised by the next calls, in order
        self.always_fail: BaseException | None = None
        self.ready = True
        self.closed = False
        self.started = False
        self.seen: list[RequestContext] = []

    @property
    def name(self) -> str:
        return str(self.endpoint) if self.endpoint else self.upstream.name

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.closed = True

    async def infer(self, request: InferRequest, ctx: RequestContext) -> InferResponse:
        self.calls += 1
        self.seen.append(ctx)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.failures:
            raise self.failures.pop(0)
        if self.always_fail is not None:
            raise self.always_fail
        server = Tensor.from_numpy("SERVER", np.array([self.name.encode()], dtype=object), "BYTES")
        return InferResponse(request.model_name, request.model_version, request.id, [*request.inputs, server])

    async def model_metadata(self, model: str, version: str, ctx: RequestContext) -> ModelMetadata:
        return ModelMetadata(model)

    async def model_ready(self, model: str, version: str, ctx: RequestContext) -> bool:
        return True

    async def server_ready(self, ctx: RequestContext) -> bool:
        if self.always_fail is not None:
            raise self.always_fail
        return self.ready



# What the registry reads when a test registers this module as a protocol.
__all__ = ["BACKEND", "FakeClient", "FakeFleet"]
BACKEND = FakeClient

class FakeFleet:
    """A client factory that remembers every fake it made, by endpoint."""

    def __init__(self) -> None:
        self.clients: dict[str, FakeClient] = {}
        self.made: list[FakeClient] = []

    def __call__(self, upstream: Any, endpoint: Any, services: Any) -> FakeClient:
        client = FakeClient(upstream, endpoint, services)
        self.clients[f"{upstream.name}/{endpoint}"] = client
        self.made.append(client)
        return client

    def __getitem__(self, key: str) -> FakeClient:
        return self.clients[key]
