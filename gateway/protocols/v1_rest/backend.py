"""The ``v1-rest`` upstream: one endpoint of a V1 server (KServe V1, TF
Serving's REST predict API), behind clients of any protocol.

``POST /v1/models/{name}[/versions/{v}]:predict`` carries the request as
rows (``instances``) or columns (``inputs``, upstream or per-model
``request_format``); upstream_codec.py maps tensors both ways. Model
readiness is ``GET /v1/models/{name}``, server liveness ``GET /`` (the
``health_path``). A V1 server describes no tensors, so V2 metadata comes
from the upstream's ``models`` option (docs/v1-rest.md).

Pass-through (``passthrough: true``, the default): a request that came from
a V1 client carries its body (:class:`~gateway.core.types.RawPayload`); those
bytes go upstream unchanged, and the answer's bytes come back beside its
decoded outputs. Such an answer must be a JSON object (else 502); one
that is valid V1 but no V2 tensors (ragged predictions, say) comes back
as its bytes alone, for the V1 listener to relay.

``EXPLAIN_OPERATION`` (``call_operation``) forwards ``:explain`` and
answers the server's JSON as a RawPayload.
"""

from __future__ import annotations

import sys
from typing import Any
from urllib.parse import quote

import orjson

from gateway.config.address import Address
from gateway.config.node import Node
from gateway.config.upstreams import UpstreamConfig
from gateway.core.errors import ErrorKind, GatewayError, model_not_found
from gateway.core.record import PASSTHROUGH_REQUEST_ONLY, PASSTHROUGH_TRANSLATED
from gateway.core.types import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    OperationRequest,
    RawPayload,
    RequestContext,
    Tensor,
)
from gateway.protocols.http_upstream import HttpUpstreamClient
from gateway.protocols.v1_rest import EXPLAIN_OPERATION
from gateway.protocols.v1_rest import upstream_codec as codec
from gateway.protocols.v1_rest.upstream_options import V1UpstreamOptions, parse_upstream_options
from gateway.runtime.services import GatewayServices
from gateway.transport.http_client.reply import UpstreamReply
from gateway.transport.upstream import reading_reply, response_limit

PROTOCOL = "v1-rest"
PLATFORM = "v1-rest"
_TF_SERVING_AVAILABLE = "AVAILABLE"
_MEASURED_BYTES_ELEMENTS = 256


def _encoded_size(tensor: Tensor) -> int:
    """Bytes a tensor's encoding works on, to decide whether to offload it:
    BYTES elements are measured only when few (measuring is a loop itself)."""
    if tensor.datatype != "BYTES":
        return int(tensor.data.nbytes)
    if tensor.data.size <= _MEASURED_BYTES_ELEMENTS:
        return sum(len(item) for item in tensor.data.reshape(-1))
    return sys.maxsize


class V1RestClient(HttpUpstreamClient):
    operations = frozenset({EXPLAIN_OPERATION})

    @classmethod
    def parse_options(cls, node: Node) -> V1UpstreamOptions:
        return parse_upstream_options(node)

    def __init__(self, upstream: UpstreamConfig, endpoint: Address | None, services: GatewayServices) -> None:
        super().__init__(upstream, endpoint, services)
        self.options: V1UpstreamOptions = self.upstream.options or V1UpstreamOptions()
        self.max_response = response_limit(self.options.max_response_bytes, self.services)
        self.max_connections = self.options.max_connections

    # --- transport ---------------------------------------------------------------

    async def _send(self, method: str, path: str, body: bytes | bytearray | None = None,
                    ctx: RequestContext | None = None) -> UpstreamReply:
        headers = {"Content-Type": codec.JSON_TYPE} if body is not None else {}
        return await self.started().request(method, path, {**headers, **self.request_headers(ctx)}, body)

    def _error(self, reply: UpstreamReply) -> GatewayError:
        return codec.decode_error(reply.status, reply.body, self.label)

    @staticmethod
    def _model_path(model: str, version: str) -> str:
        path = f"/v1/models/{quote(model, safe='')}"
        return path + f"/versions/{quote(version, safe='')}" if version else path

    # --- inference -----------------------------------------------------------------

    def _forwardable(self, request: InferRequest) -> RawPayload | None:
        raw = request.raw
        if raw is None or raw.protocol != PROTOCOL or not self.upstream.passthrough:
            return None
        return raw

    async def _body(self, request: InferRequest) -> bytes | bytearray:
        raw = self._forwardable(request)
        if raw is not None:
            return raw.body
        size = sum(_encoded_size(t) for t in request.inputs)
        return await self.services.offload.run(size, codec.encode_request, request,
                                               self.options.format_of(request.model_name))

    async def infer(self, request: InferRequest, ctx: RequestContext) -> InferResponse:
        forwarded = self._forwardable(request) is not None
        body = await self._body(request)
        path = self._model_path(request.model_name, request.model_version) + ":predict"
        reply = await self._send("POST", path, body, ctx)
        if reply.status != 200:
            raise self._error(reply)
        model = self.options.model(request.model_name)
        try:
            with reading_reply(self.label):
                outputs = await self.services.offload.run(
                    len(reply.body), codec.decode_answer, reply.body, model.outputs if model else (),
                    self.options.output_name, self.services.config.limits.max_tensor_elements)
        except GatewayError as error:
            if not forwarded or error.kind is not ErrorKind.UPSTREAM_BAD_RESPONSE:
                raise
            with reading_reply(self.label):
                await self.services.offload.run(len(reply.body), codec.load_answer, reply.body)
            outputs = []  # a V1 answer for a V1 client, though no V2 tensors: relayed as it is
        response = InferResponse(request.model_name, request.model_version, request.id, outputs)
        if forwarded:
            response.raw = RawPayload(PROTOCOL, reply.body, codec.JSON_TYPE)
        if ctx.protocol == PROTOCOL:  # a V1 client's request (its listener decides whether the answer is relayed)
            ctx.record.passthrough = PASSTHROUGH_REQUEST_ONLY if forwarded else PASSTHROUGH_TRANSLATED
        return response

    async def call_operation(self, operation: str, request: OperationRequest, ctx: RequestContext) -> Any:
        if operation != EXPLAIN_OPERATION or not isinstance(request, OperationRequest):
            return await super().call_operation(operation, request, ctx)
        inner = request.request
        body = await self._body(inner)
        reply = await self._send("POST", self._model_path(inner.model_name, inner.model_version) + ":explain",
                                 body, ctx)
        if reply.status != 200:
            raise self._error(reply)
        with reading_reply(self.label):
            codec.load_answer(reply.body, "the explanation")
        return RawPayload(PROTOCOL, reply.body, codec.JSON_TYPE)

    # --- models --------------------------------------------------------------------

    async def model_ready(self, model: str, version: str, ctx: RequestContext) -> bool:
        """KServe: ``{"name", "ready"}`` (503 when not ready); TF Serving:
        ``model_version_status`` entries, ready when one is AVAILABLE."""
        reply = await self._send("GET", self._model_path(model, version), ctx=ctx)
        if reply.status == 404:
            raise model_not_found(model, version)
        if reply.status == 503:
            return False
        if reply.status != 200:
            raise self._error(reply)
        with reading_reply(self.label):
            status = codec.load_answer(reply.body, "the model status")
        if "ready" in status:
            return status["ready"] is True
        states = status.get("model_version_status")
        if isinstance(states, list):
            return any(isinstance(s, dict) and s.get("state") == _TF_SERVING_AVAILABLE for s in states)
        return True

    async def model_metadata(self, model: str, version: str, ctx: RequestContext) -> ModelMetadata:
        """From the ``models`` option; a model not described there is
        checked to exist and shown without tensors."""
        described = self.options.model(model)
        if described is None:
            await self.model_ready(model, version, ctx)  # raises MODEL_NOT_FOUND for an unknown model
        inputs = described.inputs if described else ()
        outputs = described.outputs if described else ()
        return ModelMetadata(model, (version,) if version else (), PLATFORM, inputs, outputs)

    async def server_ready(self, ctx: RequestContext) -> bool:
        return (await self._send("GET", self.options.health_path, ctx=ctx)).status == 200

    async def list_models(self, ctx: RequestContext) -> list[str]:
        """KServe's ``GET /v1/models``; empty when the server has no list."""
        reply = await self._send("GET", "/v1/models", ctx=ctx)
        if reply.status != 200:
            return []
        try:
            models = orjson.loads(reply.body).get("models")
        except (orjson.JSONDecodeError, AttributeError):
            return []
        return [m for m in models if isinstance(m, str)] if isinstance(models, list) else []
