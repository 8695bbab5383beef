"""The ``builtin`` upstream: the embedded models, served in-process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.config.address import Address
from gateway.config.node import Node
from gateway.config.upstreams import UpstreamConfig
from gateway.core.contracts import StreamedResponse
from gateway.core.errors import model_not_found, unsupported
from gateway.core.types import (
    DERIVATIVE_OPERATION,
    Derivative,
    InferRequest,
    InferResponse,
    ModelMetadata,
    OperationRequest,
    RequestContext,
)
from gateway.protocols.base import UpstreamClient
from gateway.protocols.builtin.decoupled import DecoupledModel, RepeatInt32, decoupled_refusal
from gateway.protocols.builtin.gnn import GnnModel, GnnSettings, parse_gnn_settings
from gateway.protocols.builtin.models import MODEL_VERSION, AddSub, BuiltinModel, Forward, Identity, Trig
from gateway.protocols.builtin.sequences import (
    DEFAULT_IDLE_SECONDS,
    DEFAULT_MAX_SEQUENCES,
    DEFAULT_MAX_STATE_BYTES,
    DynaSequence,
    SequenceModel,
    SequenceSettings,
    StringDynaSequence,
)
from gateway.protocols.builtin.text import TextEmbedder, TextGenerator
from gateway.runtime.budget import InflightBudget
from gateway.runtime.services import GatewayServices

# The smallest sequences.max_state_bytes: a few sequences must fit.
MIN_STATE_BYTES = 4096
# Idle sequences are looked for (and give back their memory) every second,
# or every quarter of the idle timeout when that is shorter.
SWEEP_SECONDS = 1.0


def default_models(gnn: GnnSettings | None = None, sequences: SequenceSettings | None = None,
                   budget: InflightBudget | None = None) -> dict[str, BuiltinModel]:
    """Every embedded model, by name; the sequence models charge their state to ``budget``."""
    factories: list[Callable[[], BuiltinModel]] = [
        lambda: AddSub("simple", "INT32"),
        lambda: AddSub("simple_string", "BYTES"),
        Identity,
        Forward,
        Trig,
        lambda: GnnModel(gnn or GnnSettings()),
        lambda: SequenceModel("simple_sequence", sequences, budget=budget),
        lambda: DynaSequence("simple_dyna_sequence", sequences, budget=budget),
        lambda: StringDynaSequence("simple_string_dyna_sequence", sequences, budget=budget),
        RepeatInt32,
        TextGenerator,
        TextEmbedder,
    ]
    models = [make() for make in factories]
    return {model.name: model for model in models}


def parse_sequence_settings(node: Node) -> SequenceSettings:
    """``sequences:`` of a builtin upstream: how long an idle sequence lives,
    how many may be live per model and how many bytes of state they hold."""
    if node.value is None:
        return SequenceSettings()
    settings = SequenceSettings(node.duration("idle_timeout", DEFAULT_IDLE_SECONDS),
                                node.integer("max_sequences", DEFAULT_MAX_SEQUENCES, minimum=1),
                                node.size("max_state_bytes", DEFAULT_MAX_STATE_BYTES))
    if isinstance(settings.max_state_bytes, int) and settings.max_state_bytes < MIN_STATE_BYTES:
        node.error(f"must be at least {MIN_STATE_BYTES}, got {settings.max_state_bytes}", "max_state_bytes")
    node.check_no_unknown_keys()
    return settings


@dataclass(frozen=True, slots=True)
class BuiltinOptions:
    models: tuple[str, ...]
    gnn: GnnSettings = field(default_factory=GnnSettings)
    sequences: SequenceSettings = field(default_factory=SequenceSettings)


class BuiltinClient(UpstreamClient):
    operations = frozenset({DERIVATIVE_OPERATION})

    @classmethod
    def needs_endpoints(cls) -> bool:
        return False

    @classmethod
    def parse_options(cls, node: Node) -> Any:
        known = default_models()
        names = tuple(node.get("models", list, list(known)))
        for i, name in enumerate(names):
            if name not in known:
                node.error(f"unknown builtin model {name!r}; known: {', '.join(known)}", f"models[{i}]")
        return BuiltinOptions(names, parse_gnn_settings(node.child("gnn", None)),
                              parse_sequence_settings(node.child("sequences", None)))

    def __init__(self, upstream: UpstreamConfig, endpoint: Address | None, services: GatewayServices) -> None:
        super().__init__(upstream, endpoint, services)
        options = self.upstream.options
        if not isinstance(options, BuiltinOptions):
            options = BuiltinOptions(tuple(options or ()))
        self.models = {name: model for name, model in
                       default_models(options.gnn, options.sequences, self.services.budget).items()
                       if name in options.models}
        self._sequences = [model for model in self.models.values() if isinstance(model, SequenceModel)]
        self._sweep_seconds = max(0.05, min(SWEEP_SECONDS, options.sequences.idle_seconds / 4))
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._sequences:
            self._sweeper = asyncio.create_task(self._sweep(), name=f"sequences of {self.upstream.name}")

    async def _sweep(self) -> None:
        """Idle sequences give back their memory without waiting for a request."""
        while True:
            await asyncio.sleep(self._sweep_seconds)
            for model in self._sequences:
                model.forget_idle()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        for model in self._sequences:
            model.forget_all()  # state does not survive a reload that rebuilds the upstream

    def knows_model(self, model: str, version: str) -> bool | None:
        return model in self.models and version in ("", MODEL_VERSION)

    def _model(self, name: str, version: str) -> BuiltinModel:
        model = self.models.get(name)
        if model is None or version not in ("", MODEL_VERSION):
            raise model_not_found(name, version)
        return model

    def check_request(self, request: InferRequest) -> None:
        self._model(request.model_name, request.model_version).check_request(request)

    async def infer(self, request: InferRequest, ctx: RequestContext) -> InferResponse:
        model = self._model(request.model_name, request.model_version)
        if isinstance(model, DecoupledModel) and not model.answers_unary:
            raise unsupported(decoupled_refusal(model.name))
        outputs = model.infer(request)
        return InferResponse(model.name, MODEL_VERSION, request.id, outputs)

    async def infer_stream(self, request: InferRequest, ctx: RequestContext) -> AsyncIterator[StreamedResponse]:
        model = self._model(request.model_name, request.model_version)
        if not isinstance(model, DecoupledModel):
            yield StreamedResponse(await self.infer(request, ctx), final=True)
            return
        # As a decoupled Triton model: no response is final, the end of the stream says so.
        async for response in model.responses(request):
            yield StreamedResponse(response)

    async def model_metadata(self, model: str, version: str, ctx: RequestContext) -> ModelMetadata:
        return self._model(model, version).metadata()

    async def model_ready(self, model: str, version: str, ctx: RequestContext) -> bool:
        self._model(model, version)
        return True

    async def server_ready(self, ctx: RequestContext) -> bool:
        return True

    async def list_models(self, ctx: RequestContext) -> list[str]:
        return list(self.models)

    async def call_operation(self, operation: str, request: OperationRequest, ctx: RequestContext) -> Any:
        if (operation == DERIVATIVE_OPERATION and isinstance(request, OperationRequest)
                and isinstance(request.arguments, Derivative)):
            inner = request.request
            model = self._model(inner.model_name, inner.model_version)
            return model.derivative(model.check_inputs(inner.inputs), inner.parameters, request.arguments)
        return await super().call_operation(operation, request, ctx)
