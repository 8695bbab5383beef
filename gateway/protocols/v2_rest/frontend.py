"""V2 REST listener (aiohttp): health, metadata, readiness and inference,
plus Triton's extensions (v2_rest/extensions.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway.config.node import Node
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.limits import BYTES_ELEMENT_COST
from gateway.core.record import PASSTHROUGH_RENAMED, REQUEST_ID_HEADER
from gateway.core.types import InferRequest, InferResponse, RequestContext
from gateway.dataplane.routing import Route
from gateway.protocols.http_frontend import AiohttpRequest, HttpFrontend
from gateway.protocols.triton import BINARY_TENSOR_DATA
from gateway.protocols.triton.pipeline import InferPipeline
from gateway.protocols.triton.service import Extensions
from gateway.protocols.v2_rest import codec, errors, extensions
from gateway.protocols.v2_rest.generate import GenerateHandlers
from gateway.runtime.budget import admit_json
from gateway.transport.http_server.aiohttp_app import error_middleware, request_context
from gateway.transport.http_server.body import accepted_coding
from gateway.transport.http_server.exchange import Handler, HttpReply, HttpRequest, compress
from gateway.transport.upstream import reading_reply

if TYPE_CHECKING:
    from gateway.config.limits import Limits

PROTOCOL = codec.PROTOCOL
_HEADER_LENGTH = codec.HEADER_LENGTH.lower()

# Always served here; the gateway's own extensions follow server.extensions
# (server metadata lists exactly what the listener serves).
EXTENSIONS = [BINARY_TENSOR_DATA]
# The answer: body parts and headers (its Content-Type among them).
Answer = tuple[list[Any], dict[str, str]]


def error_reply(error: GatewayError, status: int | None = None) -> HttpReply:
    default_status, body = codec.encode_error(error)
    return HttpReply(status or default_status, [body], codec.JSON_TYPE)


_MODEL_PATHS = ("/v2/models/{model}", "/v2/models/{model}/versions/{version}")


@dataclass(frozen=True, slots=True)
class RouteOptions:
    """A route's ``options.v2-rest``."""

    # Offer the client's bytes to the upstream unchanged (the upstream's
    # own ``passthrough`` must allow it too).
    passthrough: bool = True


class V2RestFrontend(HttpFrontend):
    extensions: Extensions
    pipeline: InferPipeline[Answer]
    probe_paths = frozenset({"/v2/health/live", "/v2/health/ready"})
    status_kinds = errors.KIND_OF_HTTP_STATUS

    @classmethod
    def parse_route_options(cls, node: Node, base_dir: Path) -> RouteOptions:
        if node.value is None:
            return RouteOptions()
        options = RouteOptions(node.flag("passthrough", True))
        node.check_no_unknown_keys()
        return options

    def error_reply(self, error: GatewayError, status: int | None) -> HttpReply:
        return error_reply(error, status)

    def context(self, request: web.Request) -> RequestContext:
        """The context of a request served by the aiohttp app (extensions)."""
        return request_context(request, self.listener.name, PROTOCOL)

    @property
    def generating(self) -> GenerateHandlers:
        """Triton's generate extension (v2_rest/generate.py)."""
        handlers = getattr(self, "_generating", None)
        if handlers is None:
            handlers = self._generating = GenerateHandlers(self)
        return handlers

    def http_request(self, request: web.Request) -> HttpRequest:
        return AiohttpRequest(self, request)

    def handlers(self) -> list[tuple[str, str, Handler]]:
        handlers: list[tuple[str, str, Handler]] = [
            ("GET", "/v2", self.server_metadata), ("GET", "/v2/", self.server_metadata),
            ("GET", "/v2/health/live", self.live), ("GET", "/v2/health/ready", self.ready)]
        for prefix in _MODEL_PATHS:
            handlers += [("GET", prefix, self.model_metadata), ("GET", prefix + "/ready", self.model_ready),
                         ("POST", prefix + "/infer", self.infer), ("POST", prefix + "/generate", self.generate)]
        return handlers

    def build_app(self) -> web.Application:
        app = self.new_app([error_middleware(self.render_error, self.status_kinds)])  # V2 errors, no text pages
        self.extensions = Extensions(self.dataplane, self.services)
        self.pipeline = InferPipeline(self.extensions, self.services, RestInferWire())
        extensions.add_routes(app.router, self)
        self.add_routes(app)
        for prefix in _MODEL_PATHS:  # a stream of events: served by aiohttp (the fast path hands it over)
            app.router.add_post(prefix + "/generate_stream", self.generating.generate_stream)
        return app

    @staticmethod
    def _names(request: HttpRequest) -> tuple[str, str]:
        return request.params["model"], request.params.get("version", "")

    async def server_metadata(self, request: HttpRequest) -> HttpReply:
        identity = self.services.identity
        body = codec.encode_server_metadata(identity.name, identity.version,
                                            [*EXTENSIONS, *self.extensions.served])
        return HttpReply(200, [body], codec.JSON_TYPE)

    async def live(self, request: HttpRequest) -> HttpReply:
        return HttpReply(200)

    async def ready(self, request: HttpRequest) -> HttpReply:
        # The OIP spec: 200 means true, a 4xx means false.
        if await self.dataplane.server_ready(request.ctx):
            return HttpReply(200)
        return error_reply(GatewayError(ErrorKind.MALFORMED_REQUEST, "server is not ready"))

    async def model_metadata(self, request: HttpRequest) -> HttpReply:
        model, version = self._names(request)
        metadata = await self.dataplane.model_metadata(model, version, request.ctx)
        return HttpReply(200, [codec.encode_model_metadata(metadata)], codec.JSON_TYPE)

    async def model_ready(self, request: HttpRequest) -> HttpReply:
        model, version = self._names(request)
        if await self.dataplane.model_ready(model, version, request.ctx):
            return HttpReply(200)
        return error_reply(GatewayError(ErrorKind.MALFORMED_REQUEST, f"model '{model}' is not ready"))

    async def generate(self, request: HttpRequest) -> HttpReply:
        return await self.generating.generate(request)

    async def infer(self, request: HttpRequest) -> HttpReply:
        model, version = self._names(request)
        ctx = request.ctx
        # The model is looked up before the body is read: an unknown model is
        # 404 whatever the body holds (as Triton, MLServer), and every later
        # refusal of the body is counted under the model's label.
        route = self.dataplane.resolve(model, version, ctx)
        body = await request.read()
        header_length = request.headers.get(_HEADER_LENGTH)
        # Nesting checked and what parsing builds charged to the memory budget
        # before anything parses the JSON (a binary request's head too).
        reservation = request.reservation()
        services = self.services
        await admit_json(codec.split_body(body, header_length)[0], reservation, services.offload,
                         services.config.limits, "the request")
        # The pipeline holds the body from here, and lets go of it once an
        # upstream client's own message holds the tensors.
        exchange = self.pipeline.infer(body, header_length, model, version, route, _passthrough(route), ctx,
                                       reservation)
        del body
        parts, headers = await exchange
        headers[REQUEST_ID_HEADER] = ctx.request_id
        reply = HttpReply(200, parts, headers.pop("Content-Type", None), headers)
        # Many HTTP clients (requests, curl --compressed) accept gzip by default.
        return await compress(reply, accepted_coding(request.headers.get("accept-encoding", "")), services.offload)


def _passthrough(route: Route) -> bool:
    options = route.config.options.get(PROTOCOL)
    return not isinstance(options, RouteOptions) or options.passthrough


class RestInferWire:
    """The V2 REST side of an infer exchange (triton.pipeline). The request
    keeps the client's bytes (``raw``) only when they hold no duplicate
    JSON key: an upstream reads what the gateway checked (docs/security.md)."""

    lets_go = True

    @staticmethod
    def decode(body: bytes | bytearray, head_length: str | None, model: str, version: str, keep_raw: bool,
               limits: Limits, charge: Callable[[int], None]) -> InferRequest:
        return codec.decode_infer_request(body, head_length, model, version, limits.max_tensor_elements, limits,
                                          keep_raw=keep_raw, depth_checked=True, charge=charge)

    @staticmethod
    def decoded(request: InferRequest, ctx: RequestContext) -> None:
        """Nothing to take: the URL named the model, the headers the request."""

    @staticmethod
    def refused(error: GatewayError, request: InferRequest) -> GatewayError:
        return error

    @staticmethod
    def relayed(response: InferResponse, request: InferRequest | None, route: Route | None,
                ctx: RequestContext) -> Answer | None:
        """The upstream's own bytes when it answered the client's unchanged
        request and the route renamed nothing."""
        raw = response.raw
        if raw is None or raw.protocol != PROTOCOL or _renames(route):
            return None
        return [raw.body], {"Content-Type": raw.content_type, **raw.headers}

    @staticmethod
    def answer_size(response: InferResponse, request: InferRequest | None, route: Route | None) -> int:
        raw = response.raw
        if raw is not None and raw.protocol == PROTOCOL:
            return len(raw.body)
        # A binary number is a view of its array, JSON text of it takes at most
        # ~3 times its size; a BYTES element becomes a Python str (JSON) or a
        # length-prefixed copy on the way.
        return sum(tensor.data.size * BYTES_ELEMENT_COST if tensor.datatype == "BYTES"
                   else (tensor.data.nbytes if binary else 3 * tensor.data.nbytes)
                   for tensor, binary in zip(response.outputs, codec.output_binary_flags(response, _asked(request)),
                                                   strict=True))

    @staticmethod
    def encode(response: InferResponse, request: InferRequest | None, route: Route | None,
               ctx: RequestContext) -> Answer:
        """Encoded from the tensors, or the upstream's own bytes with the
        model name the client asked for (the route rewrote it)."""
        raw = response.raw
        if raw is None or raw.protocol != PROTOCOL:
            return codec.encode_infer_response_parts(response, _asked(request))
        ctx.record.passthrough = PASSTHROUGH_RENAMED
        renames_version = route is not None and route.config.rewrite.version is not None
        with reading_reply(ctx.record.upstream):
            return codec.renamed_response(raw.body, raw.headers.get(codec.HEADER_LENGTH), response.model_name,
                                          response.model_version if renames_version else None)


def _renames(route: Route | None) -> bool:
    """Whether the route sent the request upstream under another model name or version."""
    if route is None:
        return False
    rewrite = route.config.rewrite
    return rewrite.model is not None or rewrite.version is not None


# What an answer built without its request follows: every output as JSON.
_NOTHING_ASKED = InferRequest("")


def _asked(request: InferRequest | None) -> InferRequest:
    """The request whose outputs the answer encodes as it asked."""
    return request if request is not None else _NOTHING_ASKED
