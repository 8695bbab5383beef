"""V1 REST listener: TensorFlow Serving's / KServe V1's predict API for
clients, any upstream behind it (the mapping: codec.py, docs/protocols.md).

Every answer, errors included, is JSON; errors are ``{"error": "..."}``
with the HTTP status of their kind (errors.py). A body that is no tensors
(codec.NotTensors) goes as it is to a route of V1 servers, its answer
back as it is; elsewhere it is refused."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gateway.config.listeners import ListenerConfig
from gateway.config.node import Node
from gateway.core.cache import TtlCache
from gateway.core.errors import ErrorKind, GatewayError, unsupported
from gateway.core.limits import TensorAllowance
from gateway.core.record import REQUEST_ID_HEADER, Translating
from gateway.core.types import InferRequest, RawPayload, RequestContext, TensorSpec
from gateway.dataplane.routing import Route
from gateway.protocols.base import DataPlaneApi
from gateway.protocols.http_frontend import HttpFrontend
from gateway.protocols.v1_rest import EXPLAIN_OPERATION, codec, errors
from gateway.runtime.budget import admit_json
from gateway.runtime.services import GatewayServices
from gateway.transport.http_server.aiohttp_app import error_middleware
from gateway.transport.http_server.body import accepted_coding
from gateway.transport.http_server.exchange import Handler, HttpReply, HttpRequest, compress, json_reply

PROTOCOL = codec.PROTOCOL
DEFAULT_METADATA_TTL = 10.0
_MODEL_PATHS = ("/v1/models/{model}", "/v1/models/{model}/versions/{version}")


@dataclass(frozen=True, slots=True)
class ListenerOptions:
    # Seconds a model's input names/datatypes (its V2 metadata) are reused; 0: ask every call.
    metadata_ttl: float = DEFAULT_METADATA_TTL


class V1RestFrontend(HttpFrontend):
    probe_paths = frozenset({"/"})
    status_kinds = errors.KIND_OF_HTTP_STATUS

    @classmethod
    def parse_options(cls, node: Node) -> ListenerOptions:
        value = node.duration("metadata_ttl", DEFAULT_METADATA_TTL)
        return ListenerOptions(float(value) if value is not None else DEFAULT_METADATA_TTL)

    def __init__(self, listener: ListenerConfig, dataplane: DataPlaneApi, services: GatewayServices) -> None:
        super().__init__(listener, dataplane, services)
        options = self.listener.options
        self.options = options if isinstance(options, ListenerOptions) else ListenerOptions()
        self._inputs: TtlCache[tuple[TensorSpec, ...]] = TtlCache(self.options.metadata_ttl)

    def error_reply(self, error: GatewayError, status: int | None) -> HttpReply:
        default_status, body = codec.encode_error(error)
        return json_reply(body, status or default_status)

    def handlers(self) -> list[tuple[str, str, Handler]]:
        handlers: list[tuple[str, str, Handler]] = [("GET", "/", self.live), ("GET", "/v1/models", self.models)]
        for path in _MODEL_PATHS:
            handlers += [("GET", path, self.model_ready), ("POST", path + ":predict", self.predict),
                         ("POST", path + ":explain", self.explain), ("POST", path + ":classify", self.not_offered),
                         ("POST", path + ":regress", self.not_offered)]
        return handlers

    def build_app(self) -> web.Application:
        app = self.new_app([error_middleware(self.render_error, self.status_kinds)])  # V1 errors, no text pages
        self.add_routes(app)
        return app

    @staticmethod
    def _names(request: HttpRequest) -> tuple[str, str]:
        return request.params["model"], request.params.get("version", "")

    # --- the model behind a name -------------------------------------------

    async def model_inputs(self, model: str, version: str, route: Route,
                           ctx: RequestContext) -> tuple[TensorSpec, ...]:
        """The model's inputs from its V2 metadata (cached per route, model
        and version); empty when its upstream cannot say."""

        async def load() -> tuple[TensorSpec, ...]:
            try:
                return (await self.dataplane.model_metadata(model, version, ctx)).inputs
            except GatewayError as exc:
                if exc.kind is ErrorKind.UNSUPPORTED:
                    return ()
                raise

        return await self._inputs.get((route.index, model, version), load)

    # --- handlers -------------------------------------------------------------

    async def live(self, request: HttpRequest) -> HttpReply:
        return json_reply(b'{"status":"alive"}')

    async def models(self, request: HttpRequest) -> HttpReply:
        ctx = request.ctx
        names = await self.dataplane.list_models(ctx)
        ctx.record.model = ctx.record.version = ctx.record.route = ""  # a listing names no model
        return json_reply(codec.encode_models(names))

    async def model_ready(self, request: HttpRequest) -> HttpReply:
        model, version = self._names(request)
        ready = await self.dataplane.model_ready(model, version, request.ctx)
        return json_reply(codec.encode_model_ready(model, ready), 200 if ready else 503)

    async def predict(self, request: HttpRequest) -> HttpReply:
        model, version = self._names(request)
        ctx = request.ctx
        # Routed before the body is read: an unknown model is 404 whatever the body holds.
        route = self.dataplane.resolve(model, version, ctx)
        body = await request.read()
        reservation = request.reservation()
        limits = self.services.config.limits
        offload = self.services.offload
        # Nesting checked and what parsing builds charged to the memory budget first.
        await admit_json(body, reservation, offload, limits, "the request body")
        specs = await self.model_inputs(model, version, route, ctx)
        try:
            with Translating(ctx.record, "decode"):
                predict = await offload.run(len(body), codec.decode_predict, body, specs,
                                            TensorAllowance.of(limits, reservation.grow))
        except codec.NotTensors:
            if not self._takes_as_is(route):
                raise
            return await self._relay(request, model, version, body)
        del body
        infer_request = InferRequest(model, version, ctx.request_id, predict.inputs, parameters=predict.parameters)
        response = await self.dataplane.infer(infer_request, ctx)
        infer_request.inputs = []  # let the request go before the answer is built
        size = codec.answer_size(response.outputs)
        reservation.grow(size)
        with Translating(ctx.record, "encode"):
            answer = await offload.run(size, codec.encode_answer, response.outputs, predict.rows)
        reply = HttpReply(200, [answer], codec.JSON_TYPE, {REQUEST_ID_HEADER: ctx.request_id})
        return await compress(reply, accepted_coding(request.headers.get("accept-encoding", "")), offload)

    def _takes_as_is(self, route: Route) -> bool:
        """Whether every upstream of ``route`` is a V1 server that takes a
        V1 client's bytes as they are."""
        return self.dataplane.relays_only(route, PROTOCOL)

    async def _relay(self, request: HttpRequest, model: str, version: str, body: bytes | bytearray) -> HttpReply:
        """A body that is no tensors, to a V1 server as it is (already
        bounded, nesting checked and charged); its answer comes back as it
        is too."""
        ctx = request.ctx
        call = InferRequest(model, version, ctx.request_id, raw=RawPayload(PROTOCOL, body, codec.JSON_TYPE))
        response = await self.dataplane.infer(call, ctx)
        if response.raw is None:
            raise GatewayError(ErrorKind.INTERNAL, "the V1 upstream's answer came without its bytes")
        reply = HttpReply(200, [response.raw.body], codec.JSON_TYPE, {REQUEST_ID_HEADER: ctx.request_id})
        return await compress(reply, accepted_coding(request.headers.get("accept-encoding", "")),
                              self.services.offload)

    async def not_offered(self, request: HttpRequest) -> HttpReply:
        """TF Serving's Example-based APIs: tf.Example protos have no
        canonical tensor form (a V1 server's own :predict serves them)."""
        verb = request.path.rpartition(":")[2]
        raise unsupported(f":{verb} is not offered; use :predict with 'instances' or 'inputs'")

    async def explain(self, request: HttpRequest) -> HttpReply:
        """Forwarded as it is to upstreams that offer EXPLAIN_OPERATION (V1
        servers); 501 elsewhere: no translation can make an explainer."""
        model, version = self._names(request)
        ctx = request.ctx
        route = self.dataplane.resolve(model, version, ctx)
        if not self.dataplane.offers(route, EXPLAIN_OPERATION):
            raise unsupported(f"model '{model}' has no explainer: :explain reaches V1 upstreams only")
        body = await request.read()
        await admit_json(body, request.reservation(), self.services.offload, self.services.config.limits,
                         "the request body")
        call = InferRequest(model, version, ctx.request_id, raw=RawPayload(PROTOCOL, body, codec.JSON_TYPE))
        answer = await self.dataplane.call_operation(EXPLAIN_OPERATION, call, ctx)
        if not isinstance(answer, RawPayload):
            raise GatewayError(ErrorKind.INTERNAL, f"the upstream's explanation came as {type(answer).__name__}")
        return HttpReply(200, [answer.body], answer.content_type or codec.JSON_TYPE,
                         {REQUEST_ID_HEADER: ctx.request_id})
