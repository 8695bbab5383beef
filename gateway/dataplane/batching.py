"""Dynamic batching: requests that can share one upstream call are sent as one.

A route with ``batching`` has one :class:`Batcher` (per configuration
generation). Requests join a queue keyed by everything that must agree for
their rows to be stacked (:func:`batch_key`: input names, datatypes, every
dimension but the first, requested outputs and their options, parameters,
plus what the caller adds: target model, forwarded headers). A queue is sent
as one request, its inputs concatenated along dim 0, when it is full (or at a
preferred size) or when its oldest member has waited ``max_delay_ms``; the
answer's outputs are split back along dim 0, in order. Requests that cannot
join (no batch dimension, or more rows than ``max_batch_size``) go alone.

One member must not fail the others. Members of a batch agree on input
names, datatypes and every dimension but the first (the key), so a model's
refusal of those is each member's own. What the gateway cannot check for
every protocol (the first dimension, the values: a BYTES element that must
read as a number) shows as the upstream refusing the batch's input
(:data:`MEMBER_FAULTS`): each member is then sent alone, its own rows of the
batch, and gets its own answer or refusal, so at most ``max_batch_size``
more calls, what the members would have cost unbatched. Any other failure
is the batch's: every member gets it, saying so.

This module knows no protocol: it sees canonical requests and a ``send``
function the data plane gives it (which runs the upstream call with the
route's retries). Concatenating and splitting are numpy calls (slices are
views), never per-element Python; big concatenations run in the offload pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from gateway.config.auth import AUTHORIZATION
from gateway.config.routes import BatchingConfig
from gateway.core.errors import ErrorKind, GatewayError, bounded
from gateway.core.record import REQUEST_ID_HEADER, RequestRecord
from gateway.core.types import InferRequest, InferResponse, RequestContext, Tensor
from gateway.dataplane.routing import ALWAYS_FORWARDED
from gateway.runtime.budget import InflightBudget, Reservation
from gateway.runtime.offload import Offloader

# Sends one request upstream for the members given (their contexts carry the
# transport facts); returns the upstream's answer.
SendBatch = Callable[[InferRequest, "list[Member]"], Awaitable[InferResponse]]

_ids = itertools.count(1)
_PREFIX = f"b{os.getpid():x}-"


def new_batch_id() -> str:
    return f"{_PREFIX}{next(_ids)}"


def _frozen(value: dict[str, Any]) -> bytes | None:
    """A parameters mapping as comparable bytes; None when it cannot be told."""
    if not value:
        return b""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return None


def batch_key(request: InferRequest) -> tuple[int, Hashable] | None:
    """(rows, what must agree to share a batch), or None when the request
    cannot join one: no inputs, an input without dimensions, inputs that
    disagree on their first dimension, or parameters that cannot be compared."""
    rows = -1
    inputs = []
    for tensor in request.inputs:
        if not tensor.shape or (rows >= 0 and tensor.shape[0] != rows):
            return None
        rows = tensor.shape[0]
        parameters = _frozen(tensor.parameters)
        if parameters is None:
            return None
        inputs.append((tensor.name, tensor.datatype, tensor.shape[1:], parameters))
    if rows <= 0:
        return None
    outputs = []
    for output in request.outputs:
        parameters = _frozen(output.parameters)
        if parameters is None:
            return None
        outputs.append((output.name, parameters))
    parameters = _frozen(request.parameters)
    if parameters is None:
        return None
    return rows, (tuple(inputs), tuple(outputs), parameters)


def concatenate(members: list[InferRequest]) -> list[Tensor]:
    """The members' inputs stacked along dim 0 (their keys agree)."""
    first = members[0]
    inputs = []
    for i, tensor in enumerate(first.inputs):
        data = np.concatenate([m.inputs[i].data for m in members], axis=0)
        inputs.append(Tensor(tensor.name, tensor.datatype, tuple(int(d) for d in data.shape), data,
                             dict(tensor.parameters)))
    return inputs


def split(response: InferResponse, rows: list[int]) -> list[list[Tensor]]:
    """Each member's share of the outputs (views, not copies), in order.
    An output whose first dimension is not the batch's rows cannot be split:
    the model is not row-independent, or answered something else."""
    total = sum(rows)
    for tensor in response.outputs:
        if not tensor.shape or tensor.shape[0] != total:
            shape = list(tensor.shape)
            raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                               f"the batched answer's output '{tensor.name}' has shape {shape}, not {total} rows "
                               "as the batch sent: it cannot be split (is the model row-independent?)")
    return _shares(response.outputs, rows)


def _shares(tensors: list[Tensor], rows: list[int]) -> list[list[Tensor]]:
    """``tensors`` cut along dim 0 into ``rows``, as views."""
    shares: list[list[Tensor]] = [[] for _ in rows]
    for tensor in tensors:
        start = 0
        for share, count in zip(shares, rows, strict=True):
            data = tensor.data[start:start + count]
            share.append(Tensor(tensor.name, tensor.datatype, (count, *tensor.shape[1:]), data,
                                dict(tensor.parameters)))
            start += count
    return shares


# An upstream's refusal of a batch that one member's input may have caused
# alone: its values, its rows, the size it adds.
MEMBER_FAULTS = frozenset({ErrorKind.INVALID_INPUT, ErrorKind.MALFORMED_REQUEST, ErrorKind.TOO_LARGE})


def batch_failed(exc: GatewayError, members: int) -> GatewayError:
    """The batch's failure as each member is told it: the upstream's words
    first (clients match their start), then that the whole batch failed."""
    exc.message = bounded(f"{exc.message} (the whole batch of {members} requests failed)")
    exc.args = (exc.message,)
    return exc


@dataclass(eq=False, slots=True)
class Member:
    """One request waiting for (or riding in) a batch."""

    request: InferRequest
    rows: int
    context: RequestContext  # the caller's, handed back to ``send``
    arrived: float
    future: asyncio.Future[InferResponse]
    queue: _Queue | None = None  # while waiting to be sent
    batch: _Sent | None = None  # once sent
    batch_id: str = ""
    waited: float = 0.0  # seconds from arrival to being sent


@dataclass(eq=False, slots=True)
class _Queue:
    key: Hashable
    members: list[Member] = field(default_factory=list)
    rows: int = 0
    timer: asyncio.TimerHandle | None = None


@dataclass(eq=False, slots=True)
class _Sent:
    members: list[Member]
    task: asyncio.Task[None] | None = None


class Batcher:
    """One route's queues and the batches they send."""

    def __init__(self, route: str, config: BatchingConfig, send: SendBatch, *, offload: Offloader | None = None,
                 budget: InflightBudget | None = None, release_inputs: bool = True,
                 observe: Callable[[int, list[float]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.route = route
        self.config = config
        self._send = send
        self._offload = offload
        self._budget = budget
        # Whether members may let go of their inputs once the batch holds a
        # copy (not while a mirror still reads them).
        self._release_inputs = release_inputs
        self._observe = observe or (lambda rows, waits: None)  # rows per call, each member's wait
        self._clock = clock
        self._delay = config.max_delay_ms / 1000.0
        self._preferred = frozenset(config.preferred_batch_sizes)
        self._queues: dict[Hashable, _Queue] = {}
        self.queued = 0  # members waiting, over all queues (max_queue)
        self._tasks: set[asyncio.Task[None]] = set()

    async def infer(self, request: InferRequest, context: RequestContext, extra_key: Hashable = ()) -> InferResponse:
        """``request``'s answer, sent in a batch when it can join one. The
        caller bounds the wait (its deadline); a cancelled or timed-out
        member leaves its queue, or has its share discarded once sent."""
        keyed = batch_key(request)
        if keyed is None or keyed[0] > self.config.max_batch_size:
            return await self._alone(request, context, keyed[0] if keyed else 0)  # never mixed
        rows, key = keyed
        limit = self.config.max_queue
        if limit is not None and self.queued >= limit:
            raise GatewayError(ErrorKind.OVERLOADED, f"route '{self.route}' has {self.queued} requests waiting "
                               f"to be batched, its batching.max_queue; retry later")
        loop = asyncio.get_running_loop()
        member = Member(request, rows, context, self._clock(), loop.create_future())
        self._enqueue(member, (extra_key, key))
        try:
            return await member.future
        finally:
            self._leave(member)

    async def _alone(self, request: InferRequest, context: RequestContext, rows: int) -> InferResponse:
        member = Member(request, rows, context, self._clock(), asyncio.get_running_loop().create_future())
        member.batch_id = new_batch_id()
        if rows:
            self._observe(rows, [0.0])
        return await self._send(request, [member])

    def _enqueue(self, member: Member, key: Hashable) -> None:
        queue = self._queues.get(key)
        if queue is not None and queue.rows + member.rows > self.config.max_batch_size:
            self._flush(queue)  # full with this one: what waits goes now, this one starts the next
            queue = None
        if queue is None:
            queue = self._queues[key] = _Queue(key)
            loop = asyncio.get_running_loop()
            # A zero delay still lets the requests that arrived in the same loop turn join.
            queue.timer = loop.call_later(self._delay, self._flush, queue)
        queue.members.append(member)
        queue.rows += member.rows
        member.queue = queue
        self.queued += 1
        if queue.rows >= self.config.max_batch_size or queue.rows in self._preferred:
            self._flush(queue)

    def _leave(self, member: Member) -> None:
        """The member is done waiting (answered, failed, cancelled, timed out)."""
        queue = member.queue
        if queue is not None:  # never sent: it leaves its queue
            member.queue = None
            queue.members.remove(member)
            queue.rows -= member.rows
            self.queued -= 1
            if not queue.members:
                self._drop(queue)
            return
        sent = member.batch
        if sent is not None and sent.task is not None and not sent.task.done() \
                and all(m.future.done() for m in sent.members):
            sent.task.cancel()  # nobody waits for the answer any more

    def _drop(self, queue: _Queue) -> None:
        if queue.timer is not None:
            queue.timer.cancel()
            queue.timer = None
        if self._queues.get(queue.key) is queue:
            del self._queues[queue.key]

    def _flush(self, queue: _Queue) -> None:
        self._drop(queue)
        members = [m for m in queue.members if not m.future.done()]
        now = self._clock()
        for member in queue.members:
            member.queue = None
        self.queued -= len(queue.members)
        queue.members = []
        if not members:
            return
        batch_id = new_batch_id()
        sent = _Sent(members)
        for member in members:
            member.batch, member.batch_id, member.waited = sent, batch_id, now - member.arrived
        task = asyncio.ensure_future(self._run(sent, batch_id))
        task.set_name(f"batch {batch_id} of route {self.route}")
        sent.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, sent: _Sent, batch_id: str) -> None:
        members = sent.members
        rows = [m.rows for m in members]
        self._observe(sum(rows), [m.waited for m in members])
        held = self._budget.reserve() if self._budget is not None and len(members) > 1 else None
        try:
            request = await self._batch_request(members, batch_id, held)
            try:
                response = await self._send(request, members)
            except GatewayError as exc:
                if len(members) == 1:
                    raise
                if exc.kind not in MEMBER_FAULTS:
                    raise batch_failed(exc, len(members)) from None
                await self._each_alone(request, members)  # held until then: their rows are views of the batch
                return
            shares = split(response, rows) if len(members) > 1 else []
        except asyncio.CancelledError:
            _settle(members, GatewayError(ErrorKind.UPSTREAM_UNAVAILABLE, "the batch was cancelled"))
            raise
        except Exception as exc:  # each member raises it in its own protocol's form
            _settle(members, exc)
            return
        finally:
            if held is not None:
                held.release()
        if not shares:  # a batch of one: its own answer, as the upstream gave it (raw bytes and all)
            if not members[0].future.done():
                members[0].future.set_result(response)
            return
        for member, outputs in zip(members, shares, strict=True):
            if not member.future.done():  # else: its client left; its share is discarded
                member.future.set_result(InferResponse(response.model_name, response.model_version, "", outputs,
                                                       dict(response.parameters)))

    async def _each_alone(self, batch: InferRequest, members: list[Member]) -> None:
        """Each member sent alone with its own rows of ``batch``: the upstream
        refused the batch's input, and only a member's own call can tell
        whose input it was."""
        async def alone(member: Member, inputs: list[Tensor]) -> None:
            if member.future.done():
                return  # its client left
            member.batch_id = new_batch_id()
            self._observe(member.rows, [])
            request = InferRequest(batch.model_name, batch.model_version, member.request.id, inputs,
                                   list(batch.outputs), dict(batch.parameters))
            try:
                response = await self._send(request, [member])
            except Exception as exc:
                _settle([member], exc)
            else:
                if not member.future.done():
                    member.future.set_result(response)

        shares = _shares(batch.inputs, [m.rows for m in members])
        await asyncio.gather(*(alone(m, inputs) for m, inputs in zip(members, shares, strict=True)))

    async def _batch_request(self, members: list[Member], batch_id: str, held: Reservation | None) -> InferRequest:
        first = members[0].request
        if len(members) == 1:
            return first  # alone after all: its own request, raw bytes and all
        requests = [m.request for m in members]
        size = sum(t.data.nbytes for r in requests for t in r.inputs)  # BYTES: the references, not the items
        if held is not None:
            held.grow(size)  # the copy is charged before it is made (Saturated: every member is refused)
        inputs = concatenate(requests) if self._offload is None else \
            await self._offload.run(size, concatenate, requests)
        if self._release_inputs:
            for request in requests:  # the batch holds the rows now: the frontends may drop theirs
                handover = request.handover
                if handover is not None and not handover.dropped:
                    handover.drop()
        return InferRequest(first.model_name, first.model_version, batch_id, inputs, list(first.outputs),
                            dict(first.parameters))

    async def close(self) -> None:
        for queue in list(self._queues.values()):
            self._drop(queue)
            _settle(queue.members, GatewayError(ErrorKind.UPSTREAM_UNAVAILABLE, "the gateway is stopping"))
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def compatibility(request: InferRequest, ctx: RequestContext) -> Hashable:
    """What else members of one batch must share: the target model and what
    the upstream call carries for them (forwarded headers, the client's
    Authorization when the route forwards it)."""
    headers = tuple(sorted((k, v) for k, v in ctx.forward_headers.items()
                           if k != REQUEST_ID_HEADER and k not in ALWAYS_FORWARDED))
    authorization = ctx.headers.get(AUTHORIZATION) if ctx.forward_authorization else None
    return request.model_name, request.model_version, headers, authorization


def batch_context(members: list[Member]) -> RequestContext:
    """The context of a batch's upstream call: the first member's transport
    facts (the members agree on what goes upstream), the batch id as its
    request id, and the latest deadline of the members (each waits under its
    own). A batch of one is its member's own request."""
    first: RequestContext = members[0].context
    if len(members) == 1:
        return first
    deadlines = [m.context.deadline for m in members]
    return RequestContext(
        first.listener, first.protocol, members[0].batch_id, first.headers,
        deadline=None if None in deadlines else max(d for d in deadlines if d is not None),
        record=RequestRecord(model=first.record.model, version=first.record.version, route=first.record.route),
        forward_headers={k: v for k, v in first.forward_headers.items() if k not in ALWAYS_FORWARDED},
        route=first.route, forward_authorization=first.forward_authorization)


def share_facts(batch: RequestContext, member: Member) -> None:
    """What the batch's call learned, noted on a member's own context (its
    access-log line and metrics): the upstream, endpoint, attempts, times."""
    ctx: RequestContext = member.context
    record = ctx.record
    record.batch_id = member.batch_id
    if batch is ctx:
        return
    source = batch.record
    record.upstream, record.endpoint = source.upstream, source.endpoint
    record.upstream_seconds += source.upstream_seconds
    record.upstream_attempts += source.upstream_attempts
    record.queue_seconds += source.queue_seconds
    record.passthrough = source.passthrough
    ctx.attempts.extend(batch.attempts)


def _settle(members: list[Member], exc: BaseException) -> None:
    for member in members:
        if not member.future.done():
            with contextlib.suppress(asyncio.InvalidStateError):
                member.future.set_exception(exc)
