"""The ``umbridge`` upstream: one endpoint of a UM-Bridge 1.0 server.

Its models appear to the rest of the gateway as V2 models with one FP64
vector tensor per UM-Bridge input and output (``input_0``, ...,
``output_0``, ...); the UM-Bridge ``config`` travels as the request parameter
``umbridge_config`` (JSON text). Derivatives and config-dependent sizes are
offered through ``call_operation``.

Pass-through (``passthrough: true``, the default): an Evaluate from a
UM-Bridge client carries its body (:class:`~gateway.core.types.RawPayload`),
checked by the listener; those bytes go upstream unchanged, and the
answer's bytes come back unchanged when it is one the client may have as it
is (umbridge/passthrough.py). Derivatives are always translated.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import numpy as np

from gateway.config.address import Address
from gateway.config.node import Node
from gateway.config.upstreams import UpstreamConfig
from gateway.core.cache import TtlCache
from gateway.core.errors import GatewayError, invalid, model_not_found, unsupported
from gateway.core.record import PASSTHROUGH_REQUEST_ONLY, PASSTHROUGH_TRANSLATED, PASSTHROUGH_VERBATIM
from gateway.core.types import (
    DERIVATIVE_OPERATION,
    METADATA_OPERATION,
    Derivative,
    InferRequest,
    InferResponse,
    ModelMetadata,
    OperationRequest,
    RawPayload,
    RequestContext,
    Tensor,
)
from gateway.protocols.http_upstream import HttpUpstreamClient
from gateway.protocols.umbridge import codec, passthrough
from gateway.protocols.umbridge.mapping import umbridge_metadata
from gateway.protocols.umbridge.options import UpstreamOptions, parse_upstream_options
from gateway.runtime.services import GatewayServices

PLATFORM = "umbridge"
_INPUT_NAME = re.compile(r"^input_(0|[1-9][0-9]{0,5})$")


class UmbridgeClient(HttpUpstreamClient):
    operations = frozenset({DERIVATIVE_OPERATION, METADATA_OPERATION})

    @classmethod
    def parse_options(cls, node: Node) -> UpstreamOptions:
        return parse_upstream_options(node)

    def __init__(self, upstream: UpstreamConfig, endpoint: Address | None, services: GatewayServices) -> None:
        super().__init__(upstream, endpoint, services)
        self.options: UpstreamOptions = self.upstream.options or UpstreamOptions()
        # Without keepalive, a new connection per call (the C++ reference
        # server stalls ~40 ms on reused connections). No bound on the
        # connections: the cluster bounds the calls per endpoint. Models may
        # run for hours: only the route's deadline bounds a call.
        self.keepalive = self.options.keepalive
        self.max_response = services.config.limits.max_request_bytes
        self.limit_name = "limits.max_request_bytes"
        self._info: TtlCache[list[str]] = TtlCache(self.options.metadata_ttl)
        self._described: TtlCache[ModelMetadata] = TtlCache(self.options.metadata_ttl)

    # --- HTTP ------------------------------------------------------------------

    async def _exchange(self, method: str, path: str, body: bytes | bytearray | None,
                        ctx: RequestContext | None = None) -> tuple[int, bytes | bytearray]:
        if self.http is None:
            await self.start()
        assert self.http is not None
        headers = {"Content-Type": codec.JSON_TYPE} if body is not None else {}
        headers.update(self.request_headers(ctx))
        reply = await self.http.request(method, path, headers, body)
        return reply.status, reply.body

    async def _call(self, method: str, path: str, body: bytes | None = None,
                    ctx: RequestContext | None = None) -> dict[str, Any]:
        status, raw = await self._exchange(method, path, body, ctx)
        try:
            obj = codec.decode_answer(raw, self.label)
        except GatewayError:
            if status != 200:  # e.g. the Python reference server's text 500 page
                raise codec.decode_error(status, None, self.label) from None
            raise
        if status != 200 or "error" in obj:  # the reference client trusts only the body
            raise codec.decode_error(status, obj, self.label)
        return obj

    # --- models ------------------------------------------------------------------

    async def _models(self) -> list[str]:
        async def load() -> list[str]:
            return codec.decode_info(await self._call("GET", "/Info"), self.label)

        return await self._info.get("info", load)

    async def _describe(self, name: str, config: dict[str, Any]) -> ModelMetadata:
        """Support and sizes of a model for a config, as V2 metadata."""
        async def load() -> ModelMetadata:
            if name not in await self._models():
                raise model_not_found(name)
            body = codec.encode_request(name, config)
            info, inputs, outputs = await asyncio.gather(*(self._call("POST", path, body) for path in (
                "/ModelInfo", "/InputSizes", "/OutputSizes")))
            return umbridge_metadata(name, codec.decode_sizes(inputs, "inputSizes", self.label),
                                     codec.decode_sizes(outputs, "outputSizes", self.label),
                                     codec.decode_support(info, self.label), PLATFORM)

        return await self._described.get((name, codec.config_text(config)), load)

    @staticmethod
    def _check_version(model: str, version: str) -> None:
        if version:  # UM-Bridge models have no versions
            raise model_not_found(model, version)

    async def model_metadata(self, model: str, version: str, ctx: RequestContext) -> ModelMetadata:
        self._check_version(model, version)
        return await self._describe(model, {})

    async def model_ready(self, model: str, version: str, ctx: RequestContext) -> bool:
        self._check_version(model, version)
        if model not in await self._models():
            raise model_not_found(model)
        return True

    async def server_ready(self, ctx: RequestContext) -> bool:
        try:
            await self._models()
        except GatewayError:
            return False
        return True

    async def list_models(self, ctx: RequestContext) -> list[str]:
        return list(await self._models())

    async def health_check(self, ctx: RequestContext) -> bool:
        """A fresh ``GET /Info``: the cached model list (``metadata_ttl``)
        would hide a server that went away for that long."""
        try:
            codec.decode_info(await self._call("GET", "/Info", ctx=ctx), self.label)
        except GatewayError:
            return False
        return True

    # --- calls -------------------------------------------------------------------

    @staticmethod
    def _vectors(request: InferRequest) -> list[np.ndarray]:
        """Tensors input_0..input_{k-1} (any order, any shape) as flat float64."""
        by_index: dict[int, np.ndarray] = {}
        for tensor in request.inputs:
            match = _INPUT_NAME.match(tensor.name)
            if match is None:
                raise invalid(f"input '{tensor.name[:64]}' is not named input_0, input_1, ... as inputs of "
                              f"UM-Bridge model '{request.model_name}' are")
            if tensor.datatype in ("BYTES", "BF16"):
                raise invalid(f"input '{tensor.name}' is {tensor.datatype}; UM-Bridge models take numbers (FP64)")
            by_index[int(match.group(1))] = np.asarray(tensor.data, dtype=np.float64).reshape(-1)
        missing = [i for i in range(len(by_index)) if i not in by_index]
        if missing:
            raise invalid(f"input 'input_{missing[0]}' of UM-Bridge model '{request.model_name}' is missing")
        return [by_index[i] for i in range(len(by_index))]

    def _forwardable(self, request: InferRequest) -> bytes | bytearray | None:
        """The client's call as its bytes, when a UM-Bridge listener offered
        them (it checked them, see umbridge/passthrough.py) and this
        upstream's ``passthrough`` allows it."""
        raw = request.raw
        if raw is None or raw.protocol != codec.PROTOCOL or not self.upstream.passthrough:
            return None
        return raw.body

    @staticmethod
    def _answers_as_asked(request: InferRequest, count: int) -> bool:
        """Whether ``count`` output vectors are the outputs the request asks
        for (all, in order): else the data plane selects from them."""
        asked = [output.name for output in request.outputs]
        return not asked or asked == [f"output_{i}" for i in range(count)]

    async def infer(self, request: InferRequest, ctx: RequestContext) -> InferResponse:
        self._check_version(request.model_name, request.model_version)
        body = self._forwardable(request)
        forwarded = body is not None
        if body is None:
            config = codec.config_from_text(request.parameters.get(codec.CONFIG_PARAMETER))
            body = codec.encode_request(request.model_name, config, self._vectors(request),
                                        policy=self.options.nonfinite)
        status, answer = await self._exchange("POST", "/Evaluate", body, ctx)
        # Read (and checked) whether or not its bytes go back: a broken answer is never relayed.
        outputs, relayable = await self.services.offload.run(len(answer), passthrough.read_outputs, status, answer,
                                                             self.label)
        tensors = [Tensor.from_numpy(f"output_{i}", out, "FP64") for i, out in enumerate(outputs)]
        response = InferResponse(request.model_name, "", request.id, tensors)
        if forwarded and relayable and self._answers_as_asked(request, len(outputs)):
            response.raw = RawPayload(codec.PROTOCOL, answer, codec.JSON_TYPE)
        if ctx.protocol == codec.PROTOCOL:  # a UM-Bridge client's call (the listener may still translate the answer)
            ctx.record.passthrough = (PASSTHROUGH_VERBATIM if response.raw is not None else
                                      PASSTHROUGH_REQUEST_ONLY if forwarded else PASSTHROUGH_TRANSLATED)
        return response

    async def call_operation(self, operation: str, request: OperationRequest, ctx: RequestContext) -> Any:
        if not isinstance(request, OperationRequest):
            return await super().call_operation(operation, request, ctx)
        inner = request.request
        self._check_version(inner.model_name, inner.model_version)
        config = codec.config_from_text(inner.parameters.get(codec.CONFIG_PARAMETER))
        if operation == METADATA_OPERATION:
            return await self._describe(inner.model_name, config)
        if operation == DERIVATIVE_OPERATION and isinstance(request.arguments, Derivative):
            derivative = request.arguments
            body = codec.encode_request(inner.model_name, config, self._vectors(inner), derivative,
                                        self.options.nonfinite)
            answer = await self._call("POST", f"/{derivative.kind}", body, ctx)
            return codec.decode_vector_output(answer, self.label)
        raise unsupported(f"upstream '{self.upstream.name}' does not support {operation}")
