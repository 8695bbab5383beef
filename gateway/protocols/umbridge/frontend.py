"""UM-Bridge 1.0 listener (aiohttp).

Every call is checked in the reference order: the request's structure, then
the model (ModelNotFound), then the feature (UnsupportedFeature), then the
inputs (InvalidInput). Every answer, errors included, is JSON; no
Content-Type is required of clients (the R client sends none).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np
from aiohttp import web

from gateway.config.listeners import ListenerConfig
from gateway.config.node import Node
from gateway.core.cache import TtlCache
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.record import (
    PASSTHROUGH_RENAMED,
    PASSTHROUGH_REQUEST_ONLY,
    PASSTHROUGH_VERBATIM,
    REQUEST_ID_HEADER,
    Translating,
    operation_label,
)
from gateway.core.types import (
    DERIVATIVE_KINDS,
    DERIVATIVE_OPERATION,
    METADATA_OPERATION,
    InferRequest,
    ModelMetadata,
    RawPayload,
    RequestContext,
)
from gateway.protocols.base import DataPlaneApi
from gateway.protocols.http_frontend import HttpFrontend
from gateway.protocols.umbridge import codec, errors, passthrough
from gateway.protocols.umbridge.bridge import Bridge
from gateway.protocols.umbridge.mapping import ModelView, build_view
from gateway.protocols.umbridge.options import (
    ListenerOptions,
    RouteOptions,
    parse_listener_options,
    parse_route_options,
)
from gateway.runtime.budget import admit_json
from gateway.runtime.services import GatewayServices
from gateway.transport.http_server.aiohttp_app import error_middleware
from gateway.transport.http_server.exchange import Handler, HttpReply, HttpRequest, json_reply

log = logging.getLogger(__name__)
PROTOCOL = codec.PROTOCOL

# Failures that say nothing about whether a model exists: such models stay
# listed in /Info (last), the others are left out.
_TRANSIENT = frozenset({ErrorKind.UPSTREAM_UNAVAILABLE, ErrorKind.UPSTREAM_TIMEOUT, ErrorKind.OVERLOADED,
                        ErrorKind.UPSTREAM_OVERLOADED, ErrorKind.NOT_READY})


def answer(body: bytes | bytearray, ctx: RequestContext) -> HttpReply:
    return HttpReply(200, [body], codec.JSON_TYPE, {REQUEST_ID_HEADER: ctx.request_id})


class UmbridgeFrontend(HttpFrontend):
    status_kinds = errors.KIND_OF_HTTP_STATUS

    @classmethod
    def parse_options(cls, node: Node) -> ListenerOptions:
        return parse_listener_options(node)

    @classmethod
    def parse_route_options(cls, node: Node, base_dir: Path) -> RouteOptions:
        return parse_route_options(node)

    def __init__(self, listener: ListenerConfig, dataplane: DataPlaneApi, services: GatewayServices) -> None:
        super().__init__(listener, dataplane, services)
        self.options: ListenerOptions = self.listener.options or ListenerOptions()
        self._views: TtlCache[ModelView] = TtlCache(self.options.metadata_ttl)

    def error_reply(self, error: GatewayError, status: int | None) -> HttpReply:
        default_status, body = codec.encode_error(error)
        return json_reply(body, status or default_status)

    def handlers(self) -> list[tuple[str, str, Handler]]:
        return [("GET", "/Info", self.info), ("POST", "/InputSizes", self.input_sizes),
                ("POST", "/OutputSizes", self.output_sizes), ("POST", "/ModelInfo", self.model_info),
                ("POST", "/Evaluate", self.evaluate),
                *(("POST", f"/{kind}", self._derivative_handler(kind)) for kind in DERIVATIVE_KINDS)]

    def build_app(self) -> web.Application:
        app = self.new_app([error_middleware(self.render_error, self.status_kinds)])  # UM-Bridge JSON, no text
        self.add_routes(app)
        return app

    # --- the model behind a name -------------------------------------------

    async def _metadata(self, name: str, config_text: str, ctx: RequestContext) -> ModelMetadata:
        if config_text:  # sizes may depend on config: ask upstreams that can say
            request = InferRequest(name, parameters={codec.CONFIG_PARAMETER: config_text})
            try:
                metadata: ModelMetadata = await self.dataplane.call_operation(METADATA_OPERATION, request, ctx)
                return metadata
            except GatewayError as exc:
                if exc.kind != ErrorKind.UNSUPPORTED:
                    raise
        return await self.dataplane.model_metadata(name, "", ctx)

    async def view(self, name: str, config_text: str, ctx: RequestContext) -> ModelView:
        route = self.dataplane.resolve(name, "", ctx)
        options = route.config.options.get(PROTOCOL)
        route_options = options if isinstance(options, RouteOptions) else None

        async def load() -> ModelView:
            return build_view(name, await self._metadata(name, config_text, ctx), route_options,
                              native_derivatives=self.dataplane.offers(route, DERIVATIVE_OPERATION))

        return await self._views.get((route.index, name, config_text), load)

    # --- handlers -------------------------------------------------------------

    async def _read(self, request: HttpRequest) -> tuple[codec.Call, bytes | bytearray | None]:
        """The call, and its body when that may go upstream as it is once
        the values are checked (strict JSON, no repeated key)."""
        body = await request.read()
        reservation = request.reservation()
        await admit_json(body, reservation, self.services.offload, self.services.config.limits, "the request body")
        with Translating(request.ctx.record, "decode"):
            call, strict = await self.services.offload.run(len(body), passthrough.read_call, body, reservation.grow)
        return call, body if strict else None

    async def _call(self, request: HttpRequest) -> tuple[codec.Call, RequestContext]:
        call, _ = await self._read(request)
        return call, request.ctx

    async def info(self, request: HttpRequest) -> HttpReply:
        ctx = request.ctx
        names = await self.dataplane.list_models(ctx)
        views = await asyncio.gather(*(self.view(n, "", ctx) for n in names), return_exceptions=True)
        ready: list[str] = []
        others: list[str] = []
        unknown: list[str] = []
        for name, view in zip(names, views, strict=True):
            if isinstance(view, ModelView):
                (ready if "Evaluate" in view.support else others).append(name)
            elif isinstance(view, GatewayError) and view.kind in _TRANSIENT:
                unknown.append(name)
            elif not isinstance(view, GatewayError):
                log.error("listing model %s failed: %r", name, view)
        # A listing names no model: its metrics and log line must not carry
        # whichever model was resolved last.
        ctx.record.model = ctx.record.version = ctx.record.route = ""
        # The conformity suite and simple clients use models[0]: Evaluate-capable first.
        return answer(codec.encode_info(ready + others + unknown), ctx)

    async def input_sizes(self, request: HttpRequest) -> HttpReply:
        call, ctx = await self._call(request)
        view = await self.view(call.name, call.config_text, ctx)
        return answer(codec.encode_sizes("inputSizes", view.input_sizes), ctx)

    async def output_sizes(self, request: HttpRequest) -> HttpReply:
        call, ctx = await self._call(request)
        view = await self.view(call.name, call.config_text, ctx)
        return answer(codec.encode_sizes("outputSizes", view.output_sizes), ctx)

    async def model_info(self, request: HttpRequest) -> HttpReply:
        call, ctx = await self._call(request)
        view = await self.view(call.name, call.config_text, ctx)
        return answer(codec.encode_support(view.support), ctx)

    async def evaluate(self, request: HttpRequest) -> HttpReply:
        call, body = await self._read(request)
        ctx = request.ctx
        view = await self.view(call.name, call.config_text, ctx)
        view.require("Evaluate")
        with Translating(ctx.record, "decode"):
            inputs = codec.decode_inputs(call, view.input_sizes)
        raw, renamed = await self._forwardable(call, body, inputs, view, ctx)
        outputs, relayed = await Bridge(self.dataplane, ctx, view, call.config_text).evaluate_point(inputs, raw)
        if relayed is not None:  # the upstream's own answer
            if renamed:
                ctx.record.passthrough = PASSTHROUGH_RENAMED
            return answer(relayed, ctx)
        if ctx.record.passthrough == PASSTHROUGH_VERBATIM:  # an answer this view translates after all
            ctx.record.passthrough = PASSTHROUGH_REQUEST_ONLY
        with Translating(ctx.record, "encode"):
            body = codec.encode_outputs(outputs, self.options.nonfinite)
        return answer(body, ctx)

    async def _forwardable(self, call: codec.Call, body: bytes | bytearray | None, inputs: list[np.ndarray],
                           view: ModelView, ctx: RequestContext) -> tuple[RawPayload | None, bool]:
        """The client's body as it may go to a UM-Bridge upstream of the
        route (its ``passthrough`` on), with the upstream's model name when
        the route rewrites it, and whether it was renamed; None: translate.
        The body's values are checked by now (decode_inputs)."""
        if body is None or not view.in_upstream_order or not passthrough.finite(inputs):
            return None, False
        route = self.dataplane.resolve(call.name, "", ctx)  # the request's route, resolved once
        if not self.dataplane.relays(route, PROTOCOL):
            return None, False
        target = route.config.rewrite.model
        if target is None or target == call.name:
            return RawPayload(PROTOCOL, body, codec.JSON_TYPE), False
        renamed = await self.services.offload.run(len(body), passthrough.renamed, body, call.name, target)
        return (RawPayload(PROTOCOL, renamed, codec.JSON_TYPE), True) if renamed is not None else (None, False)

    def _derivative_handler(self, kind: str) -> Handler:
        async def handle(request: HttpRequest) -> HttpReply:
            call, ctx = await self._call(request)
            view = await self.view(call.name, call.config_text, ctx)
            view.require(kind)
            with Translating(ctx.record, "decode"):
                inputs = codec.decode_inputs(call, view.input_sizes)
                derivative = codec.decode_derivative(kind, call, view.input_sizes, view.output_sizes)
            result = await Bridge(self.dataplane, ctx, view, call.config_text).derivative(inputs, derivative)
            with Translating(ctx.record, "encode"):
                body = codec.encode_vector_output(result, self.options.nonfinite)
            return answer(body, ctx)

        # The handler's name is the request's `operation` label (gateway/transport/http_server/aiohttp_app.py).
        handle.__name__ = handle.__qualname__ = operation_label(kind)
        return handle
