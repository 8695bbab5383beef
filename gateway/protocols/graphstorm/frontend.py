"""GraphStorm real-time listener on the SageMaker container contract.

``POST /invocations`` takes a gs-realtime-v0.1 payload, ``GET /ping``
answers 200 while the gateway serves. Every invocation answers HTTP 200 with
GraphStorm's envelope; the outcome is its ``status_code``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from gateway.config.node import Node
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.graphtensors import (
    CONTRACT,
    CONTRACT_PARAMETER,
    EDGE_TASKS,
    NODE_TASKS,
    TASK_PARAMETER,
)
from gateway.core.record import REQUEST_ID_HEADER, Translating
from gateway.core.types import InferRequest, RawPayload, RequestContext, Tensor
from gateway.dataplane.routing import Route
from gateway.protocols.graphstorm import codec, errors
from gateway.protocols.graphstorm.errors import GraphStormError
from gateway.protocols.graphstorm.payload import Invocation
from gateway.protocols.graphstorm.schema import GraphSchema, load_schema
from gateway.protocols.http_frontend import HttpFrontend
from gateway.runtime.budget import admit_json
from gateway.transport.http_server.aiohttp_app import note_error
from gateway.transport.http_server.exchange import Handler, HttpReply, HttpRequest, json_reply

log = logging.getLogger(__name__)
PROTOCOL = "graphstorm"
_TARGET_MODEL_HEADER = codec.TARGET_MODEL_HEADER.lower()
DEFAULT_MODEL = "gnn"
AiohttpHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class ListenerOptions:
    # The model name routes see: a SageMaker endpoint has no model in its
    # path. The X-Amzn-SageMaker-Target-Model header, when sent, wins.
    model: str = DEFAULT_MODEL


@dataclass(frozen=True, slots=True)
class RouteOptions:
    """A route's ``options.graphstorm`` block."""

    schema: GraphSchema | None = None
    edge_tasks: bool = False

    @property
    def tasks(self) -> tuple[str, ...]:
        return NODE_TASKS + EDGE_TASKS if self.edge_tasks else NODE_TASKS


def route_options(options: Mapping[str, Any]) -> RouteOptions:
    found = options.get(PROTOCOL)
    return found if isinstance(found, RouteOptions) else RouteOptions()


def _decode_invocation(payload: Any, options: RouteOptions) -> tuple[Invocation, list[Tensor]]:
    """The payload's invocation and its graph as tensors. Big payloads are
    decoded in the offload pool, with the cycle collector paused (parsing a
    6 MB payload made full collections that found nothing and took 2-3
    times the parse)."""
    invocation = codec.decode_invocation(payload, options.schema, options.tasks)
    return invocation, invocation.graph.to_tensors()


def json_response(body: bytes, status_code: int = 200) -> web.Response:
    return web.Response(status=status_code, body=body, content_type=codec.JSON_TYPE)


@web.middleware
async def envelope_errors(request: web.Request, handler: AiohttpHandler) -> web.StreamResponse:
    """Paths and methods outside the contract answer in the envelope form
    with their HTTP status; nothing leaves as an aiohttp text page."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = f"{request.method} {request.path[:200]} is not served; use POST /invocations or GET /ping"
        note_error(request, GatewayError(errors.KIND_OF_HTTP_STATUS.get(exc.status, ErrorKind.MALFORMED_REQUEST),
                                         message))
        response = json_response(codec.encode_envelope(exc.status, "", error=message), exc.status)
        if "Allow" in exc.headers:  # a 405 names the methods allowed (RFC 9110)
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        error = errors.internal("unexpected gateway error")
        note_error(request, error)
        return json_response(codec.encode_error(error, ""))


class GraphStormFrontend(HttpFrontend):
    @classmethod
    def parse_options(cls, node: Node) -> ListenerOptions:
        return ListenerOptions(node.string("model", DEFAULT_MODEL))

    @classmethod
    def parse_route_options(cls, node: Node, base_dir: Path) -> RouteOptions:
        if not node.is_mapping:
            node.error("must be a mapping with graph_schema and edge_tasks")
            return RouteOptions()
        schema = load_schema(node.child("graph_schema"), base_dir) if node.has("graph_schema") else None
        edge_tasks = node.flag("edge_tasks", False)
        node.check_no_unknown_keys()
        return RouteOptions(schema, edge_tasks)

    @property
    def options(self) -> ListenerOptions:
        options = self.listener.options
        return options if isinstance(options, ListenerOptions) else ListenerOptions()

    probe_paths = frozenset({"/ping"})
    status_kinds = errors.KIND_OF_HTTP_STATUS

    def error_reply(self, error: GatewayError, status: int | None) -> HttpReply:
        """Refusals before GraphStorm's handler (overload, malformed HTTP,
        refused credentials: 401) carry their HTTP status as well as the
        envelope's status_code, so callers that read only the HTTP status
        see them."""
        return json_reply(codec.encode_error(error, ""), status or errors.HTTP_STATUS_OF_KIND.get(error.kind, 200))

    def handlers(self) -> list[tuple[str, str, Handler]]:
        return [("POST", "/invocations", self.invocations), ("GET", "/ping", self.ping)]

    def build_app(self) -> web.Application:
        app = self.new_app([envelope_errors])
        self.add_routes(app)
        return app

    async def ping(self, request: HttpRequest) -> HttpReply:
        if await self.dataplane.server_ready(request.ctx):
            return json_reply(orjson.dumps({"status": "Healthy"}))
        return json_reply(orjson.dumps({"status": "Unhealthy"}), 503)

    async def invocations(self, request: HttpRequest) -> HttpReply:
        uid = ""  # GraphStorm sends "" until the body parses as JSON
        ctx = request.ctx
        # The target-model header, else the listener's model. Routed first, so
        # that refusals of the body carry the model label; a routing failure
        # is answered after them, in GraphStorm's order.
        model = request.headers.get(_TARGET_MODEL_HEADER) or self.options.model
        try:
            route = self._route(model, ctx)
            codec.check_content_type(request.headers.get("content-type"))
            try:
                body = await request.read_bytes()
                await admit_json(body, request.reservation(), self.services.offload,
                                 self.services.config.limits, "the body")
            except GatewayError as exc:  # too large, too deep, slow, bad Content-Encoding: a request format error
                if exc.kind is ErrorKind.OVERLOADED:  # the memory budget: not the request's fault
                    raise
                raise GraphStormError(errors.JSON_FORMAT, exc.kind, exc.message) from None
            with Translating(ctx.record, "decode"):
                payload = await self.services.offload.run(len(body), codec.parse_json, body)
            uid = codec.request_uid(body)
            answer, status_code = await self._invoke(model, route, body, payload, uid, ctx)
        except GatewayError as error:
            answer, status_code = self._failed(ctx, error, uid)
        except Exception:  # a gateway bug: still GraphStorm's form, with the request's uid
            log.exception("unhandled error on a GraphStorm invocation (request_uid %s)", uid)
            answer, status_code = self._failed(ctx, errors.internal("unexpected gateway error"), uid)
        # The answer is HTTP 200 whatever happened: metrics and the access log
        # take GraphStorm's status_code as the request's code.
        ctx.record.status = str(status_code)
        return json_reply(answer, headers={REQUEST_ID_HEADER: ctx.request_id})

    @staticmethod
    def _failed(ctx: RequestContext, error: GatewayError, uid: str) -> tuple[bytes, int]:
        ctx.record.fail(error.kind.value, error.message)
        return codec.encode_error(error, uid), errors.status_code_of(error)

    def _route(self, model: str, ctx: RequestContext) -> Route | GatewayError:
        """The route of ``model``, or the error that refuses it."""
        try:
            return self.dataplane.resolve(model, "", ctx)
        except GatewayError as exc:
            if exc.kind is ErrorKind.INVALID_INPUT:  # a target-model header that is no valid model name
                return GraphStormError(errors.JSON_FORMAT, exc.kind, exc.message)
            return errors.internal(exc.message, exc.kind)

    async def _invoke(self, model: str, route: Route | GatewayError, body: bytes, payload: Any, uid: str,
                      ctx: RequestContext) -> tuple[bytes, int]:
        """The answer and its status_code."""
        if isinstance(route, GatewayError):
            raise route
        options = route_options(route.config.options)
        with Translating(ctx.record, "decode"):
            invocation, tensors = await self.services.offload.run(len(body), _decode_invocation, payload,
                                                                  options)
        infer_request = InferRequest(
            model, "", uid, tensors, parameters={TASK_PARAMETER: invocation.task, CONTRACT_PARAMETER: CONTRACT},
            raw=RawPayload(PROTOCOL, body, codec.JSON_TYPE))
        try:
            response = await self.dataplane.infer(infer_request, ctx)
            if response.raw is not None and response.raw.protocol == PROTOCOL:
                # A GraphStorm endpoint's own answer, unchanged, with its own status_code.
                code = response.parameters.get(codec.STATUS_PARAMETER, errors.OK)
                if code != errors.OK:
                    ctx.record.fail(errors.kind_of_status(code).value, f"the upstream answered status_code {code}")
                return bytes(response.raw.body), code  # bytes stay uncopied
            with Translating(ctx.record, "encode"):
                encoded = await self.services.offload.run(len(body), codec.encode_results, invocation,
                                                          response.outputs, uid)
                return encoded, errors.OK
        except GraphStormError:
            raise
        except GatewayError as exc:  # after validation every failure is an inference failure
            raise errors.internal(exc.message, exc.kind) from None
