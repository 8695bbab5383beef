"""V2 gRPC listener (grpc.aio): the six core RPCs, Triton's extensions
(served or refused with UNIMPLEMENTED and a reason), health and reflection.

The service is registered through generic handlers with our private-pool
message classes (see messages.py), so no generated servicer module is needed.
Requests arrive as bytes and are parsed here, so a message that is not valid
protobuf gets INVALID_ARGUMENT rather than grpc's generic INTERNAL.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gateway.config.extensions import MODEL_CONFIGURATION, MODEL_REPOSITORY, STATISTICS
from gateway.config.node import Node
from gateway.core.errors import ErrorKind, GatewayError, malformed, unsupported
from gateway.core.limits import BYTES_ELEMENT_COST
from gateway.core.record import (
    PASSTHROUGH_RENAMED,
    PASSTHROUGH_VERBATIM,
    TRACEPARENT_HEADER,
    TRACESTATE_HEADER,
    RequestRecord,
    accept_request_id,
    accept_traceparent,
    accept_tracestate,
    operation_label,
)
from gateway.core.types import InferRequest, InferResponse, RequestContext
from gateway.protocols.base import Frontend
from gateway.protocols.triton import shm
from gateway.protocols.triton.pipeline import InferPipeline
from gateway.protocols.triton.service import Extensions
from gateway.protocols.v2_grpc import codec, extensions, passthrough
from gateway.protocols.v2_grpc import messages as pb
from gateway.protocols.v2_grpc.stream import OPERATION, StreamSession
from gateway.runtime.auth import Authenticator
from gateway.runtime.budget import Reservation
from gateway.runtime.tls import ServerTls
from gateway.transport.cycle import RequestCycle, StreamSlots

if TYPE_CHECKING:
    from gateway.config.limits import Limits
    from gateway.dataplane.routing import Route

log = logging.getLogger(__name__)
PROTOCOL = passthrough.PROTOCOL
# RPCs whose handler parses the request bytes itself and answers bytes
# (raw tensors stay zero-copy views; see rawwire).
PARSED_BY_HANDLER = pb.BYTES_METHODS
# What the call being handled holds of the memory budget (set by the handler).
_RESERVATION: ContextVar[Reservation] = ContextVar("gateway_grpc_reservation")
REQUEST_ID_KEY = "x-request-id"
STREAM_RPC = "ModelStreamInfer"
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
# Answered without credentials when the listener has `auth`: liveness and
# readiness, as the REST listener's health paths (grpc.health.v1 is never
# checked; reflection and every other method are).
PUBLIC_METHODS = frozenset({"ServerLive", "ServerReady"})
# The `operation` of metrics, access log and spans: the V2 REST listener's
# names for the same questions, so one `operation="infer"` covers both V2
# transports; every other RPC is its name in snake case (ModelConfig ->
# model_config, as REST names it too).
_OPERATION_OF_RPC = {"ModelInfer": "infer", "ModelMetadata": "model_metadata", "ModelReady": "model_ready",
                     "ServerMetadata": "server_metadata", "ServerLive": "live", "ServerReady": "ready"}


class _UndecodableMetadata(logging.Filter):
    """grpc hands a metadata value that is not UTF-8 over as bytes (the
    gateway ignores it: ``_metadata_of``) and logs an ERROR with a traceback
    for each, so any client could flood the log; those records are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Invalid encoding on")


_UNDECODABLE_METADATA = _UndecodableMetadata()


def rpc_operation(rpc: str) -> str:
    return _OPERATION_OF_RPC.get(rpc) or operation_label(rpc)


@dataclass(frozen=True, slots=True)
class GrpcListenerOptions:
    # "raw": outputs in raw_output_contents (what tritonclient reads);
    # "typed": in each output's typed contents.
    output_contents: str = "raw"


def server_options(max_message_bytes: int, reuse_port: bool = False, limits: Limits | None = None
                   ) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", min(max_message_bytes, pb.GRPC_MAX_MESSAGE)),
        ("grpc.max_send_message_length", -1),  # answers are bounded by what upstreams may send
        # Shared only by `--workers N` processes; otherwise a second gateway on
        # the same port must fail, not silently share it (grpc defaults it on).
        ("grpc.so_reuseport", 1 if reuse_port else 0),
    ]
    if limits is not None:  # docs/security.md#limits
        idle_ms = int(limits.idle_timeout * 1000)
        options += [
            # Metadata past this is refused by grpc itself (RESOURCE_EXHAUSTED).
            ("grpc.max_metadata_size", limits.max_grpc_metadata_bytes),
            ("grpc.absolute_max_metadata_size", limits.max_grpc_metadata_bytes),
            # grpc closes connections past this at once (the client sees UNAVAILABLE).
            # It cannot close an idle connection to make room, as the HTTP
            # listeners do: one holds its slot until max_connection_idle_ms
            # below (docs/security.md#connections).
            # Streams per connection stay unbounded on purpose: an HTTP/2 limit would
            # make clients queue calls; the handler refuses them instead.
            ("grpc.max_allowed_incoming_connections", limits.max_connections),
            # A connection must finish its HTTP/2 handshake, and may then stay idle, this long.
            ("grpc.server_handshake_timeout_ms", idle_ms),
            ("grpc.max_connection_idle_ms", idle_ms),
        ]
    return options


def _metadata_dict(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return _metadata_of(context.invocation_metadata())


def _metadata_of(pairs: Any) -> dict[str, str]:
    return {key.lower(): value for key, value in pairs or () if isinstance(value, str)}


@dataclass(frozen=True, slots=True)
class GrpcRefusal:
    """A refused or failed call: the status it ends with, and when the
    client may retry (seconds; None: not said)."""

    code: grpc.StatusCode
    message: str
    retry_after: int | None = None


# gRPC's server pushback (gRFC A6): a client whose retry policy allows it
# waits this many milliseconds before retrying; HTTP says it as Retry-After.
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"


class _GrpcForm:
    """The cycle's errors as gRPC statuses (codec.encode_error)."""

    @staticmethod
    def refusal(error: GatewayError, status: int | None) -> GrpcRefusal:
        return GrpcRefusal(*codec.encode_error(error), getattr(error, "retry_after", None))


GRPC_FORM = _GrpcForm()


class ReflectionAuth(grpc.aio.ServerInterceptor):
    """Checks credentials on reflection calls, which bypass our handlers
    (the inference methods check them in ``handle``, where they are logged)."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        if details.method.startswith(f"/{reflection.SERVICE_NAME}/"):
            try:
                self.authenticator.check(_metadata_of(details.invocation_metadata))
            except GatewayError as error:
                code, message = codec.encode_error(error)

                async def refuse(requests: Any, context: grpc.aio.ServicerContext) -> None:
                    await context.abort(code, message)

                return grpc.stream_stream_rpc_method_handler(refuse)
        return await continuation(details)


class V2GrpcFrontend(Frontend):
    # grpcio requires a client certificate or asks for none; never "optional".
    TLS_CLIENT_AUTH_MODES = ("none", "require")
    _server: grpc.aio.Server | None = None
    _health: Any = None
    _port = 0
    _streams: StreamSlots  # open ModelStreamInfer calls
    _tls: ServerTls | None = None
    _authenticator: Authenticator | None = None
    extensions: Extensions
    pipeline: InferPipeline[bytes]
    # The listener's request cycle (gateway/transport/cycle.py): unary calls
    # and each request of a stream; grpc's own health service not counted.
    cycle: RequestCycle

    @classmethod
    def parse_options(cls, node: Node) -> GrpcListenerOptions:
        return GrpcListenerOptions(node.choice("output_contents", ("raw", "typed"), "raw"))

    @property
    def options(self) -> GrpcListenerOptions:
        return self.listener.options or GrpcListenerOptions()

    @property
    def bound_port(self) -> int:
        return self._port

    async def start(self) -> None:
        limits = self.services.config.limits
        logging.getLogger("grpc._cython.cygrpc").addFilter(_UNDECODABLE_METADATA)  # added once
        # Tokens and certificates are read now, when the listener starts.
        self.cycle = RequestCycle(self.listener.name, PROTOCOL, self.services, limits.max_concurrent_requests,
                                  PUBLIC_METHODS, self.listener.server_timing)
        if self.listener.auth is not None:
            self.cycle.credentials = self._authenticator = Authenticator(self.listener.auth)
        interceptors = [ReflectionAuth(self._authenticator)] if self._authenticator is not None else []
        server = grpc.aio.server(options=server_options(limits.max_request_bytes, self.services.reuse_port, limits),
                                 interceptors=interceptors)
        self.extensions = Extensions(self.dataplane, self.services)
        self.pipeline = InferPipeline(self.extensions, self.services,
                                      GrpcInferWire(self.options.output_contents == "typed"))
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                self._handler(name, request_class), response_serializer=pb.method_serializer(name, response_class))
            for name, (request_class, response_class) in pb.METHODS.items()
        }
        # ModelStreamInfer: bytes in and out, as ModelInfer (stream.py).
        handlers[STREAM_RPC] = grpc.stream_stream_rpc_method_handler(self._stream_handler())
        self._streams = StreamSlots(self.listener.name, PROTOCOL, self.services)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(pb.SERVICE, handlers),))
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection((pb.SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME), server, pb.POOL)
        address = self.listener.address
        self._tls = ServerTls(self.listener.tls) if self.listener.tls is not None else None
        try:
            if self._tls is not None:
                self._port = server.add_secure_port(str(address), self._tls.grpc_credentials())
            else:
                self._port = server.add_insecure_port(str(address))
        except RuntimeError as exc:
            raise OSError(f"listener {self.listener.name}: cannot bind {address}: {exc}") from None
        await server.start()
        self._server = server
        for service in ("", pb.SERVICE):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("listener %s (%s) on %s:%d%s", self.listener.name, PROTOCOL, address.host, self._port,
                 " (TLS)" if self._tls is not None else "")

    async def stop(self, grace: float) -> None:
        if self._server is None:
            return
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace)
        self._server = None

    # --- plumbing --------------------------------------------------------------

    def _handler(self, name: str, request_class: Any) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
        """The handler of a unary method (ModelStreamInfer has _stream_handler)."""
        operation: Callable[[Any, RequestContext], Awaitable[Any]] = getattr(self, f"_{name}", None) or _refuse(name)
        type_name = request_class.DESCRIPTOR.full_name
        services = self.services
        operation_name = rpc_operation(name)
        path = pb.method_path(name)

        async def handle(data: bytes, context: grpc.aio.ServicerContext) -> Any:
            cycle = self.cycle
            ctx = self._context(context)
            record = ctx.record
            cycle.begin(ctx, operation_name, "POST", path, context.peer() or "")
            record.request_bytes = len(data)
            reservation = services.budget.reserve()
            _RESERVATION.set(reservation)

            async def call() -> Any:
                reservation.grow(len(data))  # grpc has read it already: counted from here on
                if name in PARSED_BY_HANDLER:
                    message: Any = data
                else:
                    try:
                        message = request_class.FromString(data)
                    except DecodeError:
                        raise malformed(f"the request is not a valid {type_name} message") from None
                    self._adopt_message_id(ctx, str(getattr(message, "id", "")))
                return await operation(message, ctx)

            try:
                answer: Any = await cycle.run(ctx, name in cycle.probes, call, GRPC_FORM)
            except asyncio.CancelledError:  # the client went away or its deadline passed
                cycle.cancelled(ctx, grpc.StatusCode.CANCELLED.name, len(data))
                raise
            finally:
                reservation.release()
                cycle.end()
                trailers = cycle.trailers(ctx)
                context.set_trailing_metadata(trailers)
            if type(answer) is GrpcRefusal:
                record.status = answer.code.name
                cycle.finish(ctx)
                if answer.retry_after is not None:
                    context.set_trailing_metadata((*trailers, (RETRY_PUSHBACK_KEY, str(answer.retry_after * 1000))))
                await context.abort(answer.code, answer.message)
            record.status = grpc.StatusCode.OK.name
            record.response_bytes = len(answer) if isinstance(answer, bytes) else answer.ByteSize()
            # Metrics and the access log wait for the next turn of the loop:
            # grpc starts sending the answer as soon as this returns.
            asyncio.get_running_loop().call_soon(cycle.finish, ctx)
            return answer

        return handle

    @staticmethod
    def _adopt_message_id(ctx: RequestContext, message_id: str) -> None:
        """Without an x-request-id, the message's own id names the request
        (Triton echoes it)."""
        if REQUEST_ID_KEY not in ctx.headers and message_id:
            ctx.request_id = accept_request_id(message_id)

    def _context(self, context: grpc.aio.ServicerContext) -> RequestContext:
        metadata = _metadata_dict(context)
        remaining = context.time_remaining()
        traceparent = accept_traceparent(metadata.get(TRACEPARENT_HEADER))
        return RequestContext(
            listener=self.listener.name,
            protocol=PROTOCOL,
            request_id=accept_request_id(metadata.get(REQUEST_ID_KEY)),
            headers=metadata,
            deadline=time.monotonic() + remaining if remaining is not None else None,
            traceparent=traceparent,
            tracestate=accept_tracestate(metadata.get(TRACESTATE_HEADER), traceparent),
        )

    # --- the six RPCs ------------------------------------------------------------

    async def _ServerLive(self, request: Any, ctx: RequestContext) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def _ServerReady(self, request: Any, ctx: RequestContext) -> Any:
        return pb.ServerReadyResponse(ready=await self.dataplane.server_ready(ctx))

    async def _ModelReady(self, request: Any, ctx: RequestContext) -> Any:
        # Unknown models are "not ready" rather than an error, as Triton answers
        # and as a readiness probe expects.
        try:
            ready = await self.dataplane.model_ready(request.name, request.version, ctx)
        except GatewayError as error:
            if error.kind is not ErrorKind.MODEL_NOT_FOUND:
                raise
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    async def _ServerMetadata(self, request: Any, ctx: RequestContext) -> Any:
        identity = self.services.identity
        return codec.encode_server_metadata(identity.name, identity.version, list(self.extensions.served))

    async def _ModelMetadata(self, request: Any, ctx: RequestContext) -> Any:
        metadata = await self.dataplane.model_metadata(request.name, request.version, ctx)
        return codec.encode_model_metadata(metadata)

    def _ModelInfer(self, data: bytes, ctx: RequestContext) -> Coroutine[Any, Any, bytes]:
        return self.pipeline.infer(data, None, "", "", None, True, ctx, _RESERVATION.get())

    def decode_request(self, data: bytes, ctx: RequestContext, reservation: Reservation
                       ) -> Coroutine[Any, Any, tuple[InferRequest, shm.Plan | None]]:
        """A ModelInferRequest's bytes, decoded (big ones off the loop), with
        its inputs in shared memory read and the regions of its outputs."""
        return self.pipeline.decode(data, None, "", "", True, ctx, reservation)

    def encode_reply(self, response: InferResponse, ctx: RequestContext, reservation: Reservation,
                     regions: shm.Plan | None = None) -> Coroutine[Any, Any, bytes]:
        """A serialized ModelInferResponse: the upstream's own bytes when they
        can be relayed, else encoded (big ones off the loop); outputs asked
        in shared memory are written there first."""
        return self.pipeline.answer(response, None, None, ctx, reservation, regions)

    # --- ModelStreamInfer (stream.py) ------------------------------------------------

    def stream_request_context(self, stream_ctx: RequestContext) -> RequestContext:
        """A context of its own for one request of a stream."""
        record = RequestRecord(method="POST", path=stream_ctx.record.path, peer=stream_ctx.record.peer)
        return RequestContext(listener=stream_ctx.listener, protocol=stream_ctx.protocol,
                              request_id=stream_ctx.request_id, headers=stream_ctx.headers,
                              deadline=stream_ctx.deadline, traceparent=stream_ctx.traceparent,
                              tracestate=stream_ctx.tracestate, record=record)

    def _stream_handler(self) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]:
        path = pb.method_path(STREAM_RPC)

        async def handle(requests: Any, context: grpc.aio.ServicerContext) -> None:
            ctx = self._context(context)
            ctx.record.operation, ctx.record.method, ctx.record.path = OPERATION, "POST", path
            ctx.record.peer = context.peer() or ""
            try:
                if self._authenticator is not None:
                    self._authenticator.check(ctx.headers)
                self._streams.take()
            except GatewayError as error:  # the stream is refused as a whole
                code, message = codec.recorded_error(error, ctx.record)
                self.cycle.finish(ctx)
                await context.abort(code, message)
            try:
                await StreamSession(self, context, ctx).serve(requests)
            finally:
                self._streams.give_back()

        return handle

    # --- Triton's extensions (the rest of the service is refused: _refuse) ---------

    async def _ModelConfig(self, request: Any, ctx: RequestContext) -> Any:
        self.extensions.require(MODEL_CONFIGURATION)
        config = await self.extensions.model_config(request.name, request.version, ctx)
        return pb.ModelConfigResponse(config=extensions.config_from_json(config))

    async def _ModelStatistics(self, request: Any, ctx: RequestContext) -> Any:
        self.extensions.require(STATISTICS)
        return extensions.statistics_message(await self.extensions.statistics(request.name, request.version, ctx))

    async def _RepositoryIndex(self, request: Any, ctx: RequestContext) -> Any:
        self.extensions.require(MODEL_REPOSITORY)
        return extensions.index_message(await self.extensions.repository_index(ctx, request.ready))

    async def _SystemSharedMemoryStatus(self, request: Any, ctx: RequestContext) -> Any:
        return extensions.system_status_message(await self.extensions.shm_status(request.name or None, ctx))

    async def _SystemSharedMemoryRegister(self, request: Any, ctx: RequestContext) -> Any:
        await self.extensions.shm_register(request.name, request.key, request.offset, request.byte_size, ctx)
        return pb.SystemSharedMemoryRegisterResponse()

    async def _SystemSharedMemoryUnregister(self, request: Any, ctx: RequestContext) -> Any:
        await self.extensions.shm_unregister(request.name or None, ctx)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def _CudaSharedMemoryStatus(self, request: Any, ctx: RequestContext) -> Any:
        shm.cuda_status(request.name)
        return pb.CudaSharedMemoryStatusResponse()

    async def _CudaSharedMemoryUnregister(self, request: Any, ctx: RequestContext) -> Any:
        return pb.CudaSharedMemoryUnregisterResponse()  # none is ever registered


class GrpcInferWire:
    """The V2 gRPC side of an infer exchange (triton.pipeline): a message
    carries its model, version and id; its bytes are kept for a V2 gRPC
    upstream (see passthrough)."""

    lets_go = False  # grpc holds the message until the call ends

    def __init__(self, typed: bool) -> None:
        self.typed = typed  # outputs in typed contents, not raw_output_contents (output_contents)

    @staticmethod
    def decode(body: bytes | bytearray, head_length: str | None, model: str, version: str, keep_raw: bool,
               limits: Limits, charge: Callable[[int], None]) -> InferRequest:
        data = bytes(body)  # a gRPC message is bytes already: the same object, no copy
        request = codec.decode_infer_request(data, limits.max_tensor_elements, limits, charge)
        request.raw = passthrough.request_payload(data, request)
        return request

    @staticmethod
    def decoded(request: InferRequest, ctx: RequestContext) -> None:
        V2GrpcFrontend._adopt_message_id(ctx, request.id)

    @staticmethod
    def refused(error: GatewayError, request: InferRequest) -> GatewayError:
        """With the request's id, model and version (what a stream's error carries)."""
        return codec.RequestError(error, request.id, request.model_name, request.model_version)

    def relayed(self, response: InferResponse, request: InferRequest | None, route: Route | None,
                ctx: RequestContext) -> bytes | None:
        relayed = passthrough.reply_bytes(response, self.typed)
        if relayed is None:
            return None
        reply, renamed = relayed
        ctx.record.passthrough = PASSTHROUGH_RENAMED if renamed else PASSTHROUGH_VERBATIM
        log.debug("request %s: the upstream's ModelInfer reply relayed unchanged", ctx.request_id)
        return reply

    @staticmethod
    def answer_size(response: InferResponse, request: InferRequest | None, route: Route | None) -> int:
        return sum(t.data.size * BYTES_ELEMENT_COST if t.datatype == "BYTES" else t.data.nbytes
                   for t in response.outputs)

    def encode(self, response: InferResponse, request: InferRequest | None, route: Route | None,
               ctx: RequestContext) -> bytes:
        return codec.encode_infer_response(response, typed=self.typed)


def _refuse(name: str) -> Callable[[Any, RequestContext], Awaitable[Any]]:
    """An RPC the gateway cannot honour: UNIMPLEMENTED naming the extension and why."""
    reason = extensions.refusal_reason(name)

    async def refuse(request: Any, ctx: RequestContext) -> Any:
        raise unsupported(reason)

    return refuse
