"""V2 REST listener (aiohttp): health, metadata, readiness and inference,
plus Triton's extensions (v2_rest/extensions.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.config.node import Node
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.limits import BYTES_ELEMENT_COST, TensorBudget
from gateway.core.record import PASSTHROUGH_RENAMED, REQUEST_ID_HEADER
from gateway.core.types import Handover, InferRequest, InferResponse, RequestContext
from gateway.dataplane.routing import Route
from gateway.protocols.http_frontend import AiohttpRequest, HttpFrontend
from gateway.protocols.triton import BINARY_TENSOR_DATA, shm
from gateway.protocols.triton.service import Extensions
from gateway.protocols.v2_rest import codec, errors, extensions
from gateway.protocols.v2_rest.generate import GenerateHandlers
from gateway.runtime.budget import admit_json
from gateway.transport.http_server.aiohttp_app import error_middleware, request_context
from gateway.transport.http_server.body import accepted_coding
from gateway.transport.http_server.exchange import Handler, HttpReply, HttpRequest, compress
from gateway.transport.upstream import reading_reply

PROTOCOL = codec.PROTOCOL
_HEADER_LENGTH = codec.HEADER_LENGTH.lower()

# Always served here; the gateway's own extensions follow server.extensions
# (server metadata lists exactly what the listener serves).
EXTENSIONS = [BINARY_TENSOR_DATA]


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

    def context(self, request: web.Request) -> Any:
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
        limits = self.services.config.limits
        header_length = request.headers.get(_HEADER_LENGTH)
        # Nesting checked and what parsing builds charged to the memory budget
        # before anything parses the JSON (a binary request's head too).
        reservation = request.reservation()
        offload = self.services.offload
        await admit_json(codec.split_body(body, header_length)[0], reservation, offload, limits, "the request")
        started = time.perf_counter()
        # Decoded even when the bytes will be forwarded: the checks (and
        # their errors) stay the gateway's, and mirrors, splits to other
        # protocols and the statistics need the tensors. The bytes are kept
        # (infer_request.raw) only when they hold no duplicate JSON key: an
        # upstream reads what the gateway checked (docs/security.md). Big
        # bodies are decoded in the offload pool, never on the loop.
        infer_request = await offload.run(
            len(body), codec.decode_infer_request, body, header_length, model, version,
            limits.max_tensor_elements, limits, keep_raw=_passthrough(route), depth_checked=True,
            charge=reservation.grow)
        # Shared memory only when a tensor names a region: one check, no awaits otherwise.
        regions = None
        if shm.named(infer_request):
            regions = await self.extensions.shm_plan(infer_request, ctx)
            await shm.run_inputs(infer_request, regions, TensorBudget.of(limits), reservation.grow, offload)
        ctx.record.decode_seconds = time.perf_counter() - started
        # From here the inputs (views of the body) and the client's bytes hold
        # the body: an upstream client may drop them once its own message
        # holds the tensors, so a big request is not held twice while the
        # upstream works. Nothing below reads the inputs.
        del body
        infer_request.handover = Handover(lambda: _let_go(infer_request))
        try:
            response = await self.extensions.infer(infer_request, ctx)
        finally:
            infer_request.handover = None  # it refers back to the request
        if regions is not None:
            await shm.run_outputs(response, regions, reservation.grow, offload)
        # Let them go (if still held) before the answer is built, so a big
        # request and its answer do not overlap. Not in place: a mirror may
        # still be reading the inputs.
        infer_request.inputs = []
        infer_request.raw = None
        size = _answer_size(response, infer_request, route)
        reservation.grow(size)  # what encoding builds, charged before it is built
        started = time.perf_counter()
        parts, headers = await offload.run(size, _answer, response, infer_request, route, ctx)
        ctx.record.encode_seconds = time.perf_counter() - started
        headers[REQUEST_ID_HEADER] = ctx.request_id
        reply = HttpReply(200, parts, headers.pop("Content-Type", None), headers)
        # Many HTTP clients (requests, curl --compressed) accept gzip by default.
        return await compress(reply, accepted_coding(request.headers.get("accept-encoding", "")), offload)


def _let_go(request: InferRequest) -> None:
    """Drop what holds the client's body: its bytes and the decoded inputs
    (cleared in place: the data plane's copies of the request share them;
    an upstream client calls this only when no mirror reads them)."""
    request.inputs.clear()
    request.raw = None


def _passthrough(route: Route) -> bool:
    options = route.config.options.get(PROTOCOL)
    return not isinstance(options, RouteOptions) or options.passthrough


def _answer(response: InferResponse, request: InferRequest, route: Route,
            ctx: RequestContext) -> tuple[list[Any], dict[str, str]]:
    """The answer's body parts and headers: an upstream's own bytes when it
    answered the client's unchanged request (with the model name the client
    asked for when the route rewrote it), else encoded from the tensors."""
    raw = response.raw
    if raw is None or raw.protocol != PROTOCOL:
        return codec.encode_infer_response_parts(response, request)
    rewrite = route.config.rewrite
    if rewrite.model is None and rewrite.version is None:
        return [raw.body], {"Content-Type": raw.content_type, **raw.headers}
    ctx.record.passthrough = PASSTHROUGH_RENAMED
    with reading_reply(ctx.record.upstream):
        return codec.renamed_response(raw.body, raw.headers.get(codec.HEADER_LENGTH), response.model_name,
                                      response.model_version if rewrite.version is not None else None)


def _answer_size(response: InferResponse, request: InferRequest, route: Route) -> int:
    """An upper estimate of what :func:`_answer` builds: charged to the
    memory budget, and it chooses where the encoding runs."""
    raw = response.raw
    if raw is not None and raw.protocol == PROTOCOL:
        rewrite = route.config.rewrite
        return 0 if rewrite.model is None and rewrite.version is None else len(raw.body)
    # A binary number is a view of its array, JSON text of it takes at most
    # ~3 times its size; a BYTES element becomes a Python str (JSON) or a
    # length-prefixed copy on the way.
    return sum(tensor.data.size * BYTES_ELEMENT_COST if tensor.datatype == "BYTES"
               else (tensor.data.nbytes if binary else 3 * tensor.data.nbytes)
               for tensor, binary in zip(response.outputs, codec.output_binary_flags(response, request), strict=True))
