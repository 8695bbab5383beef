"""ModelStreamInfer in Triton's message form: a bidirectional stream of
ModelInferRequest in, ``ModelStreamInferResponse {error_message = 1,
infer_response = 2}`` out (docs/grpc.md#modelstreaminfer).

Each request of a stream is decoded and routed on its own, as a ModelInfer
would be, and its responses go back as they come (several for a decoupled
model), each marked with Triton's ``triton_final_response`` parameter. An
error ends that request only: it goes back as ``error_message`` (with the
request's id) and the stream goes on. Requests of one sequence (the same
``sequence_id`` parameter) run in the order they came; others run at once,
up to ``limits.max_stream_requests`` per stream.

Nothing queues without bound: past the in-flight limit the next request is
not read (grpc's flow control then slows the client), and responses wait
for a slow reader in a queue of ``limits.stream_buffer_responses``, whose
full state makes the upstream calls of the stream wait (``deliver``).
When the client cancels, every request of the stream is cancelled and all
it held of the memory budget comes back, a response still waiting for room
in the queue included (``_send``, ``_close``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass
from typing import Protocol

import grpc

from gateway.core.contracts import StreamedResponse
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.record import OUTCOME_CANCELLED
from gateway.core.types import InferRequest, InferResponse, RequestContext
from gateway.protocols.base import DataPlaneApi
from gateway.protocols.triton import shm
from gateway.protocols.v2_grpc import codec, rawwire
from gateway.protocols.v2_grpc import messages as pb
from gateway.runtime.budget import Reservation
from gateway.runtime.services import GatewayServices
from gateway.transport.cycle import RequestCycle

log = logging.getLogger(__name__)

FINAL_PARAMETER = "triton_final_response"
EMPTY_FINAL_PARAMETER = "triton_enable_empty_final_response"
SEQUENCE_PARAMETER = "sequence_id"
# ModelStreamInferResponse's fields.
ERROR_MESSAGE_FIELD, INFER_RESPONSE_FIELD = 1, 2
OPERATION = "stream_infer"
_END = None  # the outbox's last item


def _final_marker(final: bool) -> bytes:
    """A serialized ModelInferResponse holding only the final flag: appended
    to a serialized reply it adds that parameter (map entries merge)."""
    message = pb.ModelInferResponse()
    message.parameters[FINAL_PARAMETER].bool_param = final
    return message.SerializeToString()  # type: ignore[no-any-return]


_MARKERS = {True: _final_marker(True), False: _final_marker(False)}


def stream_reply(reply: bytes, final: bool) -> bytes:
    """A ModelStreamInferResponse around a serialized ModelInferResponse."""
    return rawwire.message_field(INFER_RESPONSE_FIELD, (reply, _MARKERS[final]))


class Named(Protocol):
    """What names a request in its responses (an InferRequest, a codec.RequestError)."""

    id: str
    model_name: str
    model_version: str


def stream_error(message: str, request: Named | None) -> bytes:
    """A ModelStreamInferResponse carrying an error for one request, with
    what Triton puts beside it: the request's id, model and the final flag
    (only a message too broken to name its request goes without)."""
    head = pb.ModelInferResponse()
    if request is not None:
        head.id, head.model_name, head.model_version = request.id, request.model_name, request.model_version
    head.parameters[FINAL_PARAMETER].bool_param = True
    return pb.ModelStreamInferResponse(error_message=message, infer_response=head).SerializeToString()  # type: ignore[no-any-return]


def empty_final(request: InferRequest) -> bytes:
    """The empty final response Triton sends a decoupled model's client that
    asked for it (``triton_enable_empty_final_response``)."""
    head = pb.ModelInferResponse(id=request.id, model_name=request.model_name, model_version=request.model_version)
    head.parameters[FINAL_PARAMETER].bool_param = True
    return pb.ModelStreamInferResponse(infer_response=head).SerializeToString()  # type: ignore[no-any-return]


def sequence_key(request: InferRequest) -> Hashable:
    """The request's sequence (None when it belongs to none: 0 or empty)."""
    value = request.parameters.get(SEQUENCE_PARAMETER)
    return value if value not in (None, 0, "") else None


class StreamHost(Protocol):
    """What a session needs of its frontend (frontend.V2GrpcFrontend)."""

    services: GatewayServices
    dataplane: DataPlaneApi
    cycle: RequestCycle  # the listener's: its limit counts the streams' requests too

    def stream_request_context(self, stream_ctx: RequestContext) -> RequestContext: ...

    async def decode_request(self, data: bytes, ctx: RequestContext,
                             reservation: Reservation) -> tuple[InferRequest, shm.Plan | None]: ...

    async def encode_reply(self, response: InferResponse, ctx: RequestContext, reservation: Reservation,
                           regions: shm.Plan | None = None) -> bytes: ...


class StreamSession:
    """One ModelStreamInfer call."""

    def __init__(self, frontend: StreamHost, context: grpc.aio.ServicerContext, stream_ctx: RequestContext) -> None:
        self.frontend = frontend
        self.services = frontend.services
        self.context = context
        self.stream_ctx = stream_ctx
        limits = self.services.config.limits
        # Each item: a message and what it holds of the memory budget.
        self.outbox: asyncio.Queue[tuple[bytes, Reservation | None] | None] = asyncio.Queue(
            limits.stream_buffer_responses)
        self.slots = asyncio.Semaphore(limits.max_stream_requests)
        self.tasks: set[asyncio.Task[None]] = set()
        self.sequences: dict[Hashable, asyncio.Task[None]] = {}  # sequence -> its latest request
        self.failure: BaseException | None = None
        self.closed = False  # the client is gone or the stream has ended: nothing more is sent

    async def serve(self, requests: AsyncIterator[bytes]) -> None:
        reader = asyncio.ensure_future(self._read(requests))
        try:
            while (item := await self.outbox.get()) is not _END:
                message, reservation = item
                try:
                    await self.context.write(message)
                finally:
                    if reservation is not None:
                        reservation.release()
            await reader
            if self.failure is not None:
                raise self.failure
        except (asyncio.CancelledError, grpc.aio.InternalError) as exc:
            # The client went away (grpc cancels the handler, or a read or write finds
            # the call gone first) or the server is stopping: routine, one line, no traceback.
            log.info("ModelStreamInfer stream %s (listener %s) ended early: the client went away or "
                     "the server is stopping; %d of its requests cancelled", self.stream_ctx.request_id,
                     self.stream_ctx.listener, len(self.tasks))
            # The call is over: no status can be sent. grpc ends a cancelled handler
            # quietly, where any other error would be logged with its traceback.
            raise asyncio.CancelledError from exc
        finally:
            await self._close(reader)

    async def _close(self, reader: asyncio.Future[None]) -> None:
        """Cancels what is left of the stream and gives back what its unsent
        messages hold, even if this is cancelled in turn."""
        self.closed = True  # from now on a message is dropped rather than queued (_send)
        tasks = [reader, *self.tasks]
        for task in tasks:
            task.cancel()
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            while not self.outbox.empty():
                item = self.outbox.get_nowait()
                if item is not _END and item[1] is not None:
                    item[1].release()
            for task in tasks:
                _drop_cancellation(task)

    async def _read(self, requests: AsyncIterator[bytes]) -> None:
        """Reads and decodes requests one by one (so a sequence's order is
        the order they came in) and starts each as a task of its own."""
        try:
            async for data in requests:
                await self.slots.acquire()  # past the limit, the next request stays unread
                await self._admit(data)
            while self.tasks:
                await asyncio.wait(set(self.tasks))
        except Exception as exc:  # reading failed: the stream ends with the error
            self.failure = exc
        await self.outbox.put(_END)

    async def _send(self, message: bytes, reservation: Reservation | None = None) -> None:
        """Queues a message for the client. What it holds of the budget is
        given back once it is written, or here when it never will be: the
        stream is closed, or the wait for room in the outbox is cancelled."""
        queued = False
        try:
            if not self.closed:
                await self.outbox.put((message, reservation))
                queued = True
        finally:
            if not queued and reservation is not None:
                reservation.release()

    async def _admit(self, data: bytes) -> None:
        frontend, services = self.frontend, self.services
        cycle = frontend.cycle
        ctx = frontend.stream_request_context(self.stream_ctx)
        record = ctx.record
        cycle.begin(ctx, OPERATION, record.method, record.path, record.peer)
        record.request_bytes = len(data)
        busy = cycle.over_limit()
        cycle.requests += 1  # given back with the rest of its accounting (_end)
        state = _Request(ctx, services.budget.reserve())
        try:
            if busy is not None:
                raise busy
            state.reservation.grow(len(data))
            request, regions = await frontend.decode_request(data, ctx, state.reservation)
        except asyncio.CancelledError:
            self._end(state, cancelled=True)
            raise
        except Exception as exc:
            state.responses = 1
            named = exc if isinstance(exc, codec.RequestError) else None
            task = asyncio.ensure_future(self._fail(exc, ctx, named))
        else:
            key = sequence_key(request)
            previous = self.sequences.get(key) if key is not None else None
            task = asyncio.ensure_future(self._run(request, regions, state, previous))
            if key is not None:
                self.sequences[key] = task
                task.add_done_callback(lambda done: self._sequence_done(key, done))
        self.tasks.add(task)
        # The request's accounting ends with its task, even one cancelled before it ran.
        task.add_done_callback(lambda done: self._end(state, done.cancelled()))
        task.add_done_callback(self.tasks.discard)

    def _sequence_done(self, key: Hashable, task: asyncio.Task[None]) -> None:
        if self.sequences.get(key) is task:
            del self.sequences[key]

    async def _run(self, request: InferRequest, regions: shm.Plan | None, state: _Request,
                   previous: asyncio.Task[None] | None) -> None:
        ctx, record = state.ctx, state.ctx.record
        if previous is not None and not previous.done():  # a sequence's requests in order
            await asyncio.wait([previous])
        enable_empty_final = bool(request.parameters.pop(EMPTY_FINAL_PARAMETER, False))
        if enable_empty_final:
            request.raw = None  # the client's bytes hold a parameter upstreams must not see
            ctx.end_marked = True  # the empty final response tells the end: nothing is held back
        final = False
        started = time.monotonic()

        async def deliver(part: StreamedResponse) -> None:
            nonlocal final
            held = self.services.budget.reserve()  # until the message is written
            try:
                reply = await self.frontend.encode_reply(part.response, ctx, held, regions)
            except BaseException:
                held.release()
                raise
            message = stream_reply(reply, part.final)
            state.responses += 1
            final = part.final
            record.response_bytes += len(message)
            if state.first_seconds is None:
                state.first_seconds = time.monotonic() - started
            await self._send(message, held)

        try:
            await self.frontend.dataplane.infer_stream(request, ctx, deliver)
            if not final and enable_empty_final:
                await self._send(empty_final(request))
            record.status = "OK"
        except Exception as exc:
            state.responses += 1
            await self._fail(exc, ctx, request)

    async def _fail(self, exc: BaseException, ctx: RequestContext, request: Named | None) -> None:
        """An error for one request: sent in its place, then the stream goes on."""
        if isinstance(exc, GatewayError):
            error = exc
        else:
            log.error("unhandled error in a ModelStreamInfer request", exc_info=exc)
            error = GatewayError(ErrorKind.INTERNAL, "internal error")
        _, message = codec.recorded_error(error, ctx.record)
        await self._send(stream_error(message, request))

    def _end(self, state: _Request, cancelled: bool) -> None:
        ctx = state.ctx
        if cancelled:
            ctx.record.status, ctx.record.outcome = "CANCELLED", OUTCOME_CANCELLED
        state.reservation.release()
        cycle = self.frontend.cycle
        cycle.requests -= 1
        cycle.end()
        self.slots.release()
        self.services.metrics.observe_stream_request(ctx.listener, ctx.protocol, state.responses, state.first_seconds)
        cycle.finish(ctx)


def _drop_cancellation(task: asyncio.Future[None]) -> None:
    """A cancelled task keeps its CancelledError, whose traceback keeps the
    request's frames (its messages) and, through the asyncio.timeout of its
    upstream call, the task: a cycle only the cyclic collector frees, late,
    while RSS holds the buffers. Taking the error out breaks the cycle."""
    if task.cancelled():
        try:
            task.result()
        except asyncio.CancelledError:
            pass


@dataclass(slots=True)
class _Request:
    """One request of a stream, for its accounting."""

    ctx: RequestContext
    reservation: Reservation
    responses: int = 0
    first_seconds: float | None = None
