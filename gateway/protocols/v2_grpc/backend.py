"""V2 gRPC upstream client: one grpc.aio channel per endpoint, raw contents.

Every call carries the request's remaining time as its gRPC deadline, so
the upstream can give up when the client would no longer wait. Replies are
parsed here (not by grpc) so an unparseable one is reported clearly.

A big request is held once while the upstream works (docs/performance.md,
"Big tensors"): its message is built in one allocation, the client's body
is dropped as soon as the message exists (when the frontend allows it, see
``Handover``), and the message itself once grpc has written it, unless the
route may retry a try that reached the upstream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError

from gateway.config.address import Address
from gateway.config.node import Node
from gateway.config.upstreams import UpstreamConfig
from gateway.core.contracts import StreamedResponse
from gateway.core.errors import CONNECT_FAILURE, ErrorKind, GatewayError, malformed
from gateway.core.record import PASSTHROUGH_REQUEST_ONLY, PASSTHROUGH_TRANSLATED
from gateway.core.types import (
    MODEL_CONFIG_OPERATION,
    InferRequest,
    InferResponse,
    ModelMetadata,
    OperationRequest,
    RawPayload,
    RequestContext,
)
from gateway.protocols.base import UpstreamClient
from gateway.protocols.v2_grpc import codec, extensions, passthrough, upstream_stream
from gateway.protocols.v2_grpc import messages as pb
from gateway.runtime.services import GatewayServices
from gateway.runtime.tls import grpc_channel_credentials, grpc_channel_options
from gateway.transport.upstream import (
    HOLD_LAST,
    parse_response_limit,
    parse_stream_relay,
    reading_reply,
    response_limit,
)

if TYPE_CHECKING:
    from gateway.config.routes import RouteConfig

log = logging.getLogger(__name__)
# Reconnect soon after an upstream comes back (grpc's default backoff grows to 120 s).
_MAX_RECONNECT_BACKOFF_MS = 5000
# ModelInfer messages from this size on go as a client-streaming call of one
# message (on the wire the same frames as a unary call): grpc lets go of the
# message, and of its own copy, once they are written, where a unary call
# holds both until the answer has arrived. Smaller ones take the unary
# call's single batch. Only such messages take the client's body over.
STREAMED_MIN_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class GrpcUpstreamOptions:
    max_response_bytes: int | None = None  # None: 4 x limits.max_request_bytes
    stream_form: str = upstream_stream.AUTO  # what its ModelStreamInfer streams: auto | triton | mlserver
    stream_relay: str = HOLD_LAST  # MLServer's form: hold_last | immediate (gateway/transport/upstream.py)


class V2GrpcClient(UpstreamClient):
    _channel: grpc.aio.Channel | None = None

    @classmethod
    def parse_options(cls, node: Node) -> GrpcUpstreamOptions:
        return GrpcUpstreamOptions(parse_response_limit(node),
                                   node.choice("stream_form", upstream_stream.FORMS, upstream_stream.AUTO),
                                   parse_stream_relay(node))

    def __init__(self, upstream: UpstreamConfig, endpoint: Address | None, services: GatewayServices) -> None:
        super().__init__(upstream, endpoint, services)
        options: GrpcUpstreamOptions = self.upstream.options or GrpcUpstreamOptions()
        self.max_response = response_limit(options.max_response_bytes, self.services)
        self._calls: dict[str, Any] = {}
        # The form of the upstream's ModelStreamInfer; None until learned (auto).
        self.stream_form: str | None = None if options.stream_form == upstream_stream.AUTO else options.stream_form
        self.hold_last = options.stream_relay == HOLD_LAST

    async def start(self) -> None:
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", min(self.max_response, pb.GRPC_MAX_MESSAGE)),
            ("grpc.max_send_message_length", -1),  # requests were bounded when they arrived
            ("grpc.max_reconnect_backoff_ms", _MAX_RECONNECT_BACKOFF_MS),
        ]
        tls = self.upstream.tls
        endpoint = self.endpoint
        if endpoint is not None and endpoint.name is not None and (tls is None or tls.server_name is None):
            # A discovered address: connect to it, present the name it was found
            # under (:authority and TLS server name) as a client of the name would.
            options.append(("grpc.default_authority", f"{endpoint.name}:{endpoint.port}"))
            if tls is not None:
                options.append(("grpc.ssl_target_name_override", endpoint.name))
        if tls is None:
            self._channel = grpc.aio.insecure_channel(str(self.endpoint), options=options)
        else:  # certificates are read now (docs/security.md)
            self._channel = grpc.aio.secure_channel(str(self.endpoint), grpc_channel_credentials(tls),
                                                    options=options + grpc_channel_options(tls))
        self._calls = {name: self._channel.unary_unary(pb.method_path(name),
                                                       request_serializer=pb.method_serializer(name, request_class))
                       for name, (request_class, _) in pb.METHODS.items()}
        self._streamed_infer = self._channel.stream_unary(pb.method_path("ModelInfer"))  # bytes as they are
        self._stream_infer = self._channel.stream_stream(pb.method_path("ModelStreamInfer"))  # bytes both ways

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def _time_left(self, ctx: RequestContext) -> float | None:
        timeout = ctx.remaining()
        if timeout is not None and timeout <= 0:
            raise GatewayError(ErrorKind.UPSTREAM_TIMEOUT, f"no time left to call upstream {self.label}")
        if self._channel is None:
            raise GatewayError(ErrorKind.INTERNAL, f"upstream {self.label} is not started")
        return timeout

    async def _call(self, name: str, request: Any, ctx: RequestContext, parse: bool = True) -> Any:
        timeout = self._time_left(ctx)
        call = self._calls[name]
        metadata = codec.metadata(self.request_headers(ctx))
        try:
            data = await call(request, timeout=timeout, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            # grpc core's words for a transport failure name the address: the
            # data plane cuts it from what the client sees (gateway/dataplane/plane.py).
            raise codec.decode_error(exc.code(), exc.details(), self.label) from None
        if not parse:
            return data
        response_class = pb.METHODS[name][1]
        with reading_reply(self.label):
            try:
                return response_class.FromString(data)
            except DecodeError:
                raise malformed(f"not a valid {response_class.DESCRIPTOR.full_name} message") from None

    async def infer(self, request: InferRequest, ctx: RequestContext) -> InferResponse:
        # Serialized by hand and parsed by hand: raw tensors are never copied
        # through protobuf objects (see rawwire). A V2 gRPC client's own
        # bytes go as they are (see passthrough).
        payload = self._forwarded(request, ctx)
        reply = await self._model_infer(request, ctx, payload)
        with reading_reply(self.label):
            response, raw_outputs = codec.decode_infer_response_form(
                reply, self.services.config.limits.max_tensor_elements)
        if payload is not None:  # the client may get these bytes back (the frontend decides)
            response.raw = passthrough.response_payload(reply, response, raw_outputs)
        return response

    def _forwarded(self, request: InferRequest, ctx: RequestContext) -> passthrough.GrpcPayload | None:
        """The V2 gRPC client's own message, when this upstream takes it as it
        is (``passthrough``); the record notes the request's side either way
        (the frontend settles the answer's side)."""
        payload = passthrough.client_bytes(request)
        if payload is None:
            return None
        passed = self.upstream.passthrough
        ctx.record.passthrough = PASSTHROUGH_REQUEST_ONLY if passed else PASSTHROUGH_TRANSLATED
        return payload if passed else None

    async def _model_infer(self, request: InferRequest, ctx: RequestContext,
                           payload: passthrough.GrpcPayload | None) -> bytes:
        """ModelInfer's reply for ``request`` (``payload``: the client's own
        message, to forward). The message lives in this frame only, so that
        it is let go once written (see ``STREAMED_MIN_BYTES``)."""
        if payload is not None:
            message = passthrough.upstream_bytes(payload, request)
            log.debug("request %s: ModelInfer bytes forwarded unchanged to %s", ctx.request_id, self.endpoint_label)
        else:
            message = await self._message(request, ctx)
        if len(message) < STREAMED_MIN_BYTES:
            return await self._call("ModelInfer", message, ctx, parse=False)
        timeout = self._time_left(ctx)
        call = self._streamed_infer(timeout=timeout, metadata=codec.metadata(self.request_headers(ctx)))
        try:
            await call.write(message)
            del message  # grpc holds neither it nor its copy now: the data is on its way
            _written(request, ctx)
            await call.done_writing()
            reply: bytes = await call
        except grpc.aio.AioRpcError as exc:
            raise codec.decode_error(exc.code(), exc.details(), self.label) from None
        except asyncio.InvalidStateError:  # the call ended before the message went: its status says why
            raise codec.decode_error(await call.code(), await call.details(), self.label) from None
        except BaseException:
            call.cancel()
            raise
        return reply

    async def _message(self, request: InferRequest, ctx: RequestContext) -> bytes:
        """The serialized request, built in the offload pool when big. A big
        one takes the client's data over when the frontend allows it and no
        mirror reads the inputs; a retry then sends the first try's message."""
        handover = request.handover
        if handover is not None and handover.dropped:
            kept = handover.message
            if kept is None or kept.protocol != passthrough.PROTOCOL:
                raise GatewayError(ErrorKind.UPSTREAM_UNAVAILABLE,
                                   f"upstream {self.label} failed after the request reached it; its tensors were "
                                   "let go once sent, so it is not sent again")
            return bytes(kept.body)  # the same bytes object
        size = sum(tensor.data.nbytes for tensor in request.inputs)
        message = await self.services.offload.run(size, codec.encode_infer_request, request)
        if handover is not None and len(message) >= STREAMED_MIN_BYTES and _unmirrored(ctx):
            # The body's budget charge (held until the request ends) covers the message from here.
            handover.drop(RawPayload(passthrough.PROTOCOL, message, passthrough.CONTENT_TYPE))
            request.raw = None  # this copy's reference to the client's bytes
        return message

    async def infer_stream(self, request: InferRequest, ctx: RequestContext) -> AsyncIterator[StreamedResponse]:
        """The request's responses from the upstream's ModelStreamInfer, one
        call per request: the request is written, the writing side closed,
        and each message read back is a response (upstream_stream has the two
        forms). Closing this iterator early (the client cancelled, the
        deadline passed) cancels the call, which ends the upstream's stream."""
        form = self.stream_form or await self._learn_stream_form(ctx)
        payload = self._forwarded(request, ctx)
        message = passthrough.upstream_bytes(payload, request) if payload is not None \
            else await self._message(request, ctx)
        call = self._stream_infer(timeout=self._time_left(ctx), metadata=codec.metadata(self.request_headers(ctx)))
        max_elements = self.services.config.limits.max_tensor_elements
        held: StreamedResponse | None = None  # MLServer's form: a response is known to be the last at the end
        try:
            try:
                try:
                    await call.write(message)
                    del message
                    _written(request, ctx)
                    await call.done_writing()
                except asyncio.InvalidStateError:  # the call ended before the message went: its status says why
                    raise codec.decode_error(await call.code(), await call.details(), self.label) from None
                async for data in call:  # grpc's flow control: a slow consumer slows the upstream
                    part = upstream_stream.stream_part(data, form, self.label, max_elements)
                    if form == upstream_stream.TRITON or not self.hold_last or ctx.end_marked:
                        yield part
                        continue
                    if held is not None:
                        yield held
                    held = part
            except grpc.aio.AioRpcError as exc:
                raise codec.decode_error(exc.code(), exc.details(), self.label) from None
        except GatewayError:
            if held is not None:  # what came before the error is the client's, unflagged
                pending, held = held, None
                yield pending
            raise
        finally:
            call.cancel()  # nothing when it has ended; else the upstream sees the cancel
        if held is not None:
            held.final = True
            yield held

    async def _learn_stream_form(self, ctx: RequestContext) -> str:
        """``stream_form: auto``: the server's name in its metadata says it
        (asked once per endpoint; a server without ServerMetadata is taken
        for Triton's form)."""
        try:
            name = (await self._call("ServerMetadata", pb.ServerMetadataRequest(), ctx)).name
        except GatewayError as error:
            if error.kind != ErrorKind.UNSUPPORTED:
                raise
            name = ""
        self.stream_form = upstream_stream.form_of_server(name)
        log.info("upstream %s: server %r, ModelStreamInfer in %s's form", self.endpoint_label, name[:100],
                 self.stream_form)
        return self.stream_form

    async def model_metadata(self, model: str, version: str, ctx: RequestContext) -> ModelMetadata:
        reply = await self._call("ModelMetadata", pb.ModelMetadataRequest(name=model, version=version), ctx)
        with reading_reply(self.label):
            return codec.decode_model_metadata(reply)

    async def model_ready(self, model: str, version: str, ctx: RequestContext) -> bool:
        reply = await self._call("ModelReady", pb.ModelReadyRequest(name=model, version=version), ctx)
        return bool(reply.ready)

    async def server_ready(self, ctx: RequestContext) -> bool:
        return bool((await self._call("ServerReady", pb.ServerReadyRequest(), ctx)).ready)

    async def list_models(self, ctx: RequestContext) -> list[str]:
        """Triton's repository index, where the server offers it."""
        try:
            reply = await self._call("RepositoryIndex", pb.RepositoryIndexRequest(), ctx)
        except GatewayError:
            return []
        return extensions.index_from_message(reply)

    async def call_operation(self, operation: str, request: OperationRequest, ctx: RequestContext) -> Any:
        """``model_config``: Triton's ``ModelConfig`` RPC; servers without it
        answer UNIMPLEMENTED and the gateway synthesizes one."""
        if operation != MODEL_CONFIG_OPERATION or not isinstance(request, OperationRequest):
            return await super().call_operation(operation, request, ctx)
        inner = request.request
        reply = await self._call("ModelConfig", pb.ModelConfigRequest(name=inner.model_name,
                                                                        version=inner.model_version), ctx)
        return extensions.config_to_json(reply.config)


def _route(ctx: RequestContext) -> RouteConfig | None:
    """The configuration of the route the data plane chose (None when a
    caller went around the data plane)."""
    resolved = ctx.resolved
    return resolved[3].config if resolved is not None else None


def _unmirrored(ctx: RequestContext) -> bool:
    """Whether this call is the only reader of the request's inputs: mirrors
    read them in tasks of their own, whenever they get to run."""
    route = _route(ctx)
    return route is not None and not route.mirror


def _written(request: InferRequest, ctx: RequestContext) -> None:
    """The message is written: the upstream has it. Keep it for a retry only
    when the route retries more than connect failures (a try whose message
    went out had connected); else it is freed now."""
    handover = request.handover
    if handover is None or handover.message is None:
        return
    route = _route(ctx)
    policy = route.retry if route is not None else None
    if policy is not None and (policy.attempts < 2 or all(reason == CONNECT_FAILURE for reason in policy.retry_on)):
        handover.message = None
