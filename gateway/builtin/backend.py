"""The ``builtin`` upstream: the embedded models, served in-process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.builtin.decoupled import DecoupledModel, RepeatInt32, decoupled_refusal
from gateway.builtin.gnn import GnnModel, GnnSettings, parse_gnn_settings
from gateway.builtin.models import MODEL_VERSION, AddSub, BuiltinModel, Forward, Identity, Trig
from gateway.builtin.sequences import (
    DEFAULT_IDLE_SECONDS,
    DEFAULT_MAX_SEQUENCES,
    DynaSequence,
    SequenceModel,
    SequenceSettings,
    StringDynaSequence,
)
from gateway.confignode import Node
from gateway.errors import model_not_found, unsupported
from gateway.protocols.base import StreamedResponse, UpstreamClient
from gateway.types import (
    DERIVATIVE_OPERATION,
    Derivative,
    ExtensionRequest,
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestContext,
)


def default_models(gnn: GnnSettings | None = None,
                   sequences: SequenceSettings | None = None) -> dict[str, BuiltinModel]:
    """Every embedded model, by name."""
    factories: list[Callable[[], BuiltinModel]] = [
        lambda: AddSub("simple", "INT32"),
        lambda: AddSub("simple_string", "BYTES"),
        Identity,
        Forward,
        Trig,
        lambda: GnnModel(gnn or GnnSettings()),
        lambda: SequenceModel("simple_sequence", sequences),
        lambda: DynaSequence("simple_dyna_sequence", sequences),
        lambda: StringDynaSequence("simple_string_dyna_sequence", sequences),
        RepeatInt32,
    ]
    models = [make() for make in factories]
    return {model.name: model for model in models}


def parse_sequence_settings(node: Node) -> SequenceSettings:
    """``sequences:`` of a builtin upstream: how long an idle sequence lives
    and how many may be live per model."""
    if node.value is None:
        return SequenceSettings()
    settings = SequenceSettings(node.duration("idle_timeout", DEFAULT_IDLE_SECONDS),
                                node.integer("max_sequences", DEFAULT_MAX_SEQUENCES, minimum=1))
    node.check_no_unknown_keys()
    return settings


@dataclass(frozen=True, slots=True)
class BuiltinOptions:
    models: tuple[str, ...]
    gnn: GnnSettings = field(default_factory=GnnSettings)
    sequences: SequenceSettings = field(default_factory=SequenceSettings)


class BuiltinClient(UpstreamClient):
    extensions = frozenset({DERIVATIVE_OPERATION})

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

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        options = self.upstream.options
        if not isinstance(options, BuiltinOptions):
            options = BuiltinOptions(tuple(options or ()))
        self.models = {name: model for name, model in default_models(options.gnn, options.sequences).items()
                       if name in options.models}

    def knows_model(self, model: str, version: str) -> bool | None:
        return model in self.models and version in ("", MODEL_VERSION)

    def _model(self, name: str, version: str) -> BuiltinModel:
        model = self.models.get(name)
        if model is None or version not in ("", MODEL_VERSION):
            raise model_not_found(name, version)
        return model

    async def infer(self, request: InferRequest, ctx: RequestContext) -> InferResponse:
        model = self._model(request.model_name, request.model_version)
        if isinstance(model, DecoupledModel):
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

    async def call_extension(self, operation: str, request: Any, ctx: RequestContext) -> Any:
        if (operation == DERIVATIVE_OPERATION and isinstance(request, ExtensionRequest)
                and isinstance(request.arguments, Derivative)):
            inner = request.request
            model = self._model(inner.model_name, inner.model_version)
            return model.derivative(model.check_inputs(inner.inputs), inner.parameters, request.arguments)
        return await super().call_extension(operation, request, ctx)
