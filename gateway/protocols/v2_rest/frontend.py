"""V2 REST listener (aiohttp): health, metadata, readiness and inference."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from gateway.errors import ErrorKind, GatewayError
from gateway.httpserver import REQUEST_ID_HEADER, HttpFrontend, error_middleware, request_context
from gateway.protocols.v2_rest import codec

PROTOCOL = "v2-rest"

# Extensions this listener really serves (server metadata must not lie).
EXTENSIONS = ["binary_tensor_data"]


def error_response(error: GatewayError, status: int | None = None) -> web.Response:
    default_status, body = codec.encode_error(error)
    return web.Response(status=status or default_status, body=body, content_type=codec.JSON_TYPE)


# Every failure leaves in the V2 error form, never aiohttp's text pages.
v2_errors = error_middleware(
    error_response,
    {404: ErrorKind.MODEL_NOT_FOUND, 405: ErrorKind.UNSUPPORTED, 413: ErrorKind.TOO_LARGE})


class V2RestFrontend(HttpFrontend):
    probe_paths = frozenset({"/v2/health/live", "/v2/health/ready"})

    def render_error(self, error: GatewayError, status: int | None) -> web.StreamResponse:
        return error_response(error, status)

    def build_app(self) -> web.Application:
        app = self.new_app([v2_errors])
        get, post = app.router.add_get, app.router.add_post
        get("/v2", self.server_metadata)
        get("/v2/", self.server_metadata)
        get("/v2/health/live", self.live)
        get("/v2/health/ready", self.ready)
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            get(prefix, self.model_metadata)
            get(prefix + "/ready", self.model_ready)
            post(prefix + "/infer", self.infer)
        return app

    def _ctx(self, request: web.Request) -> Any:
        return request_context(request, self.listener.name, PROTOCOL)

    @staticmethod
    def _names(request: web.Request) -> tuple[str, str]:
        return request.match_info["model"], request.match_info.get("version", "")

    async def server_metadata(self, request: web.Request) -> web.Response:
        identity = self.services.identity
        body = codec.encode_server_metadata(identity.name, identity.version, EXTENSIONS)
        return web.Response(body=body, content_type=codec.JSON_TYPE)

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def ready(self, request: web.Request) -> web.Response:
        # The OIP spec: 200 means true, a 4xx means false.
        if await self.dataplane.server_ready(self._ctx(request)):
            return web.Response(status=200)
        return error_response(GatewayError(ErrorKind.MALFORMED_REQUEST, "server is not ready"))

    async def model_metadata(self, request: web.Request) -> web.Response:
        model, version = self._names(request)
        metadata = await self.dataplane.model_metadata(model, version, self._ctx(request))
        return web.Response(body=codec.encode_model_metadata(metadata), content_type=codec.JSON_TYPE)

    async def model_ready(self, request: web.Request) -> web.Response:
        model, version = self._names(request)
        if await self.dataplane.model_ready(model, version, self._ctx(request)):
            return web.Response(status=200)
        return error_response(GatewayError(ErrorKind.MALFORMED_REQUEST, f"model '{model}' is not ready"))

    async def infer(self, request: web.Request) -> web.Response:
        model, version = self._names(request)
        ctx = self._ctx(request)
        body = await self.read_body(request)
        limits = self.services.config.limits
        started = time.perf_counter()
        infer_request = codec.decode_infer_request(
            body, request.headers.get(codec.HEADER_LENGTH), model, version, limits.max_tensor_elements, limits)
        ctx.record.decode_seconds = time.perf_counter() - started
        response = await self.dataplane.infer(infer_request, ctx)
        started = time.perf_counter()
        payload, headers = codec.encode_infer_response(response, infer_request)
        ctx.record.encode_seconds = time.perf_counter() - started
        headers[REQUEST_ID_HEADER] = ctx.request_id
        reply = web.Response(body=payload, headers=headers)
        accepted = request.headers.get("Accept-Encoding", "").lower()
        if "gzip" in accepted:
            reply.enable_compression(web.ContentCoding.gzip)
        elif "deflate" in accepted:
            reply.enable_compression(web.ContentCoding.deflate)
        return reply
