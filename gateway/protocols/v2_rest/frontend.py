"""V2 REST listener (aiohttp): health, metadata, readiness and inference,
plus Triton's extensions (v2_rest/extensions.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.budget import admit_json
from gateway.confignode import Node
from gateway.errors import ErrorKind, GatewayError
from gateway.extensions import BINARY_TENSOR_DATA
from gateway.extensions.service import Extensions
from gateway.httpserver import (
    REQUEST_ID_HEADER,
    HttpFrontend,
    accepted_coding,
    error_middleware,
    request_context,
)
from gateway.limits import BYTES_ELEMENT_COST
from gateway.observe import PASSTHROUGH_RENAMED
from gateway.protocols.upstream import reading_reply
from gateway.protocols.v2_rest import codec, extensions
from gateway.routing import Route
from gateway.types import InferRequest, InferResponse, RequestContext

PROTOCOL = codec.PROTOCOL

MIN_COMPRESSED_BYTES = 1024
# Binary answers from this size on are streamed part by part (see _stream).
STREAM_MIN_BYTES = 1 << 20

# Always served here; the gateway's own extensions follow server.extensions
# (server metadata lists exactly what the listener serves).
EXTENSIONS = [BINARY_TENSOR_DATA]


def error_response(error: GatewayError, status: int | None = None) -> web.Response:
    default_status, body = codec.encode_error(error)
    return web.Response(status=status or default_status, body=body, content_type=codec.JSON_TYPE)


# Every failure leaves in the V2 error form, never aiohttp's text pages.
v2_errors = error_middleware(
    error_response,
    {404: ErrorKind.MODEL_NOT_FOUND, 405: ErrorKind.UNSUPPORTED, 413: ErrorKind.TOO_LARGE})


@dataclass(frozen=True, slots=True)
class RouteOptions:
    """A route's ``options.v2-rest``."""

    # Offer the client's bytes to the upstream unchanged (the upstream's
    # own ``passthrough`` must allow it too).
    passthrough: bool = True


class V2RestFrontend(HttpFrontend):
    extensions: Extensions
    probe_paths = frozenset({"/v2/health/live", "/v2/health/ready"})

    @classmethod
    def parse_route_options(cls, node: Node, base_dir: Path) -> RouteOptions:
        if node.value is None:
            return RouteOptions()
        options = RouteOptions(node.flag("passthrough", True))
        node.check_no_unknown_keys()
        return options

    def render_error(self, error: GatewayError, status: int | None) -> web.StreamResponse:
        return error_response(error, status)

    def build_app(self) -> web.Application:
        app = self.new_app([v2_errors])
        self.extensions = Extensions(self.dataplane, self.services)
        get, post = app.router.add_get, app.router.add_post
        get("/v2", self.server_metadata)
        get("/v2/", self.server_metadata)
        get("/v2/health/live", self.live)
        get("/v2/health/ready", self.ready)
        extensions.add_routes(app.router, self)
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            get(prefix, self.model_metadata)
            get(prefix + "/ready", self.model_ready)
            post(prefix + "/infer", self.infer)
        return app

    def context(self, request: web.Request) -> Any:
        return request_context(request, self.listener.name, PROTOCOL)

    @staticmethod
    def _names(request: web.Request) -> tuple[str, str]:
        return request.match_info["model"], request.match_info.get("version", "")

    async def server_metadata(self, request: web.Request) -> web.Response:
        identity = self.services.identity
        body = codec.encode_server_metadata(identity.name, identity.version,
                                            [*EXTENSIONS, *self.extensions.served])
        return web.Response(body=body, content_type=codec.JSON_TYPE)

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def ready(self, request: web.Request) -> web.Response:
        # The OIP spec: 200 means true, a 4xx means false.
        if await self.dataplane.server_ready(self.context(request)):
            return web.Response(status=200)
        return error_response(GatewayError(ErrorKind.MALFORMED_REQUEST, "server is not ready"))

    async def model_metadata(self, request: web.Request) -> web.Response:
        model, version = self._names(request)
        metadata = await self.dataplane.model_metadata(model, version, self.context(request))
        return web.Response(body=codec.encode_model_metadata(metadata), content_type=codec.JSON_TYPE)

    async def model_ready(self, request: web.Request) -> web.Response:
        model, version = self._names(request)
        if await self.dataplane.model_ready(model, version, self.context(request)):
            return web.Response(status=200)
        return error_response(GatewayError(ErrorKind.MALFORMED_REQUEST, f"model '{model}' is not ready"))

    async def infer(self, request: web.Request) -> web.StreamResponse:
        model, version = self._names(request)
        ctx = self.context(request)
        # The model is looked up before the body is read: an unknown model is
        # 404 whatever the body holds (as Triton, MLServer), and every later
        # refusal of the body is counted under the model's label.
        route = self.dataplane.resolve(model, version, ctx)
        body = await self.read_buffer(request)
        limits = self.services.config.limits
        header_length = request.headers.get(codec.HEADER_LENGTH)
        # Nesting checked and what parsing builds charged to the memory budget
        # before anything parses the JSON (a binary request's head too).
        reservation = self.reservation(request)
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
        ctx.record.decode_seconds = time.perf_counter() - started
        response = await self.extensions.infer(infer_request, ctx)
        # The inputs (views of the body) are done with: let them go before the
        # answer is built, so a big request and its answer do not overlap.
        infer_request.inputs = []
        infer_request.raw = None
        del body
        size = _answer_size(response, infer_request, route)
        reservation.grow(size)  # what encoding builds, charged before it is built
        started = time.perf_counter()
        parts, headers = await offload.run(size, _answer, response, infer_request, route, ctx)
        ctx.record.encode_seconds = time.perf_counter() - started
        headers[REQUEST_ID_HEADER] = ctx.request_id
        size = sum(memoryview(part).nbytes for part in parts)
        coding = _compression(request, size)
        if coding is None and len(parts) > 1 and size >= STREAM_MIN_BYTES:
            return await _stream(request, parts, headers, size)
        reply = web.Response(body=parts[0] if len(parts) == 1 else b"".join(parts), headers=headers)
        if coding is not None:
            reply.enable_compression(coding)
        return reply


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


def _compression(request: web.Request, size: int) -> web.ContentCoding | None:
    """The coding the client accepts, if the answer is worth compressing:
    many HTTP clients (requests, curl --compressed) accept gzip by default,
    and below MIN_COMPRESSED_BYTES compressing costs more than it saves."""
    if size < MIN_COMPRESSED_BYTES:
        return None
    coding = accepted_coding(request.headers.get("Accept-Encoding", ""))
    return None if coding is None else web.ContentCoding(coding)


async def _stream(request: web.Request, parts: list[Any], headers: dict[str, str], size: int) -> web.StreamResponse:
    """A binary answer written part by part, each tensor straight from its
    array, instead of first joined into one more copy of the whole answer."""
    reply = web.StreamResponse(headers=headers)
    reply.content_length = size
    await reply.prepare(request)
    for part in parts:
        await reply.write(part)
    await reply.write_eof()
    return reply
