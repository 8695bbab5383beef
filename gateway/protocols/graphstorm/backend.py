"""The ``graphstorm`` upstream: a GraphStorm real-time endpoint (SageMaker
container contract, ``POST /invocations``, ``GET /ping``).

Requests that came from a GraphStorm client carry their original bytes
(:class:`~gateway.core.types.RawPayload`); those are forwarded unchanged and the
endpoint's answer comes back unchanged, so ``request_uid`` and every
``status_code`` are the endpoint's own. Requests from other protocols carry
the graph as tensors (see ``gateway/core/graphtensors.py``); they are encoded as
a payload and the results decoded back into ``prediction/...`` tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.address import Address
from gateway.config.node import Node
from gateway.config.upstreams import UpstreamConfig
from gateway.core.errors import ErrorKind, GatewayError, invalid
from gateway.core.graphtensors import (
    CONTRACT,
    CONTRACT_PARAMETER,
    EDGE_TASKS,
    NODE_TASKS,
    TASK_PARAMETER,
    GraphTensors,
)
from gateway.core.types import InferRequest, InferResponse, ModelMetadata, RawPayload, RequestContext
from gateway.protocols.graphstorm import codec, errors
from gateway.protocols.http_upstream import HttpUpstreamClient
from gateway.runtime.services import GatewayServices

PROTOCOL = "graphstorm"
PLATFORM = "graphstorm_realtime"
_MAX_CONNECTIONS = 100  # per endpoint (what aiohttp's pool allowed before)


@dataclass(frozen=True, slots=True)
class BackendOptions:
    invocations_path: str = "/invocations"
    ping_path: str = "/ping"


class GraphStormClient(HttpUpstreamClient):
    # A GraphStorm answer is bounded as a request is; few connections per endpoint.
    limit_name = "limits.max_request_bytes"
    max_connections = _MAX_CONNECTIONS

    def __init__(self, upstream: UpstreamConfig, endpoint: Address | None, services: GatewayServices) -> None:
        super().__init__(upstream, endpoint, services)
        self.max_response = services.config.limits.max_request_bytes

    @classmethod
    def parse_options(cls, node: Node) -> BackendOptions:
        options = BackendOptions(node.string("invocations_path", "/invocations"), node.string("ping_path", "/ping"))
        for key in ("invocations_path", "ping_path"):
            if not getattr(options, key).startswith("/"):
                node.error("must start with '/'", key)
        return options

    @property
    def options(self) -> BackendOptions:
        options = self.upstream.options
        return options if isinstance(options, BackendOptions) else BackendOptions()

    async def infer(self, request: InferRequest, ctx: RequestContext) -> InferResponse:
        raw = request.raw if request.raw is not None and request.raw.protocol == PROTOCOL else None
        if not self.upstream.passthrough:  # `passthrough: false`: always re-encoded
            raw = None
        graph: GraphTensors | None = None
        if raw is not None:
            body = raw.body
        else:
            graph = GraphTensors.from_tensors(request.inputs)
            task = request.parameters.get(TASK_PARAMETER, NODE_TASKS[0])
            if task not in NODE_TASKS + EDGE_TASKS:
                raise invalid(f"parameter '{TASK_PARAMETER}' must be one of {', '.join(NODE_TASKS + EDGE_TASKS)}")
            body = codec.encode_request(graph, task)
        headers = {"Content-Type": codec.JSON_TYPE, "Accept": codec.JSON_TYPE, **self.request_headers(ctx)}
        if codec.TARGET_MODEL_HEADER.lower() in ctx.headers:
            headers[codec.TARGET_MODEL_HEADER] = request.model_name
        answer = await self._exchange("POST", self.options.invocations_path, body, headers)
        envelope = codec.decode_envelope(answer, self.label)
        if graph is None:
            return InferResponse(request.model_name, request.model_version, request.id,
                                 parameters={codec.STATUS_PARAMETER: envelope["status_code"]},
                                 raw=RawPayload(PROTOCOL, answer, codec.JSON_TYPE))
        if envelope["status_code"] != 200:
            raise codec.upstream_error(envelope, self.label)
        outputs = codec.decode_predictions(envelope, graph, self.label)
        return InferResponse(request.model_name, request.model_version, request.id, outputs)

    async def _exchange(self, method: str, path: str, body: bytes | bytearray | None = None,
                        headers: dict[str, str] | None = None) -> bytes | bytearray:
        headers = headers if headers is not None else self.request_headers(None)
        if self.http is None:
            raise GatewayError(ErrorKind.UPSTREAM_UNAVAILABLE, f"upstream {self.label} is not started")
        reply = await self.http.request(method, path, headers, body)
        if reply.status != 200:
            raise GatewayError(errors.kind_of_http_status(reply.status),
                               f"upstream {self.label} answered HTTP {reply.status} on {path}")
        return reply.body

    async def _ping(self) -> bool:
        try:
            await self._exchange("GET", self.options.ping_path)
        except GatewayError:
            return False
        return True

    async def model_metadata(self, model: str, version: str, ctx: RequestContext) -> ModelMetadata:
        # A GraphStorm endpoint describes nothing; its inputs are the graph
        # tensor contract, named by the parameter.
        return ModelMetadata(model, (), PLATFORM, parameters={CONTRACT_PARAMETER: CONTRACT})

    async def model_ready(self, model: str, version: str, ctx: RequestContext) -> bool:
        return await self._ping()

    async def server_ready(self, ctx: RequestContext) -> bool:
        return await self._ping()
