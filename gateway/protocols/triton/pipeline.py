"""One V2 infer exchange, as both V2 listeners (REST and gRPC) run it.

decode (off the loop when big; what it builds charged to the request's
reservation) -> shared-memory inputs (only when a tensor names a region)
-> the Triton extensions' infer -> shared-memory outputs -> the answer:
the upstream's own bytes relayed, or its size charged before it is built
and then encoded (off the loop when big).

Each listener hands the pipeline its wire form (:class:`InferWire`), made
of its own codec's functions; nothing here knows a wire.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from gateway.core.errors import GatewayError
from gateway.core.limits import TensorAllowance
from gateway.core.types import Handover, InferRequest, InferResponse, RequestContext
from gateway.protocols.triton import shm

if TYPE_CHECKING:
    from gateway.config.limits import Limits
    from gateway.dataplane.routing import Route
    from gateway.protocols.triton.service import Extensions
    from gateway.runtime.budget import Reservation
    from gateway.runtime.services import GatewayServices

# A listener's answer: REST's body parts and headers, gRPC's serialized message.
Answer = TypeVar("Answer")
Answer_co = TypeVar("Answer_co", covariant=True)


class InferWire(Protocol[Answer_co]):
    """A V2 listener's side of an infer exchange: its codec's functions.

    ``request`` is None for an answer built from the response alone (each
    answer of a gRPC stream); ``route`` is None where the listener resolves
    none itself."""

    # The listener owns the client's body: it lets go of it once an upstream
    # client's own message holds the tensors (core.types.Handover).
    lets_go: bool

    def decode(self, body: bytes | bytearray, head_length: str | None, model: str, version: str,
               keep_raw: bool, limits: Limits, charge: Callable[[int], None]) -> InferRequest:
        """The canonical request (may run in the offload pool); the wire
        facts a message carries itself come as None or empty."""
        ...

    def decoded(self, request: InferRequest, ctx: RequestContext) -> None:
        """What the listener takes from the request on the loop, before
        anything may refuse it."""
        ...

    def refused(self, error: GatewayError, request: InferRequest) -> GatewayError:
        """``error`` as the listener raises it for a request decoded this far."""
        ...

    def relayed(self, response: InferResponse, request: InferRequest | None, route: Route | None,
                ctx: RequestContext) -> Answer_co | None:
        """The upstream's own bytes as the answer when they need no
        body-sized work (marked in the record), else None."""
        ...

    def answer_size(self, response: InferResponse, request: InferRequest | None, route: Route | None) -> int:
        """An upper estimate of what :meth:`encode` builds."""
        ...

    def encode(self, response: InferResponse, request: InferRequest | None, route: Route | None,
               ctx: RequestContext) -> Answer_co:
        """The answer built (may run in the offload pool)."""
        ...


class InferPipeline(Generic[Answer]):
    """A V2 listener's infer exchanges: one per listener, built with its wire."""

    def __init__(self, extensions: Extensions, services: GatewayServices, wire: InferWire[Answer]) -> None:
        self.extensions = extensions
        self.services = services
        self.lets_go = wire.lets_go
        # Bound once: a request looks none of them up.
        self._decode, self._decoded, self._refused = wire.decode, wire.decoded, wire.refused
        self._relayed, self._answer_size, self._encode = wire.relayed, wire.answer_size, wire.encode

    async def infer(self, body: bytes | bytearray, head_length: str | None, model: str, version: str,
                    route: Route | None, keep_raw: bool, ctx: RequestContext, reservation: Reservation) -> Answer:
        """``body`` decoded, inferred and answered. A listener that lets go
        of the body keeps no reference to it while this runs."""
        request, regions = await self.decode(body, head_length, model, version, keep_raw, ctx, reservation)
        del body  # the inputs (views of it) and the request's raw bytes hold it from here
        if self.lets_go:
            request.handover = Handover(lambda: _let_go(request))
        try:
            response = await self.extensions.infer(request, ctx)
        finally:
            request.handover = None  # it refers back to the request
        if self.lets_go:
            # Let them go (if still held) before the answer is built, so a big
            # request and its answer do not overlap. Not in place: a mirror may
            # still be reading the inputs.
            request.inputs = []
            request.raw = None
        return await self.answer(response, request, route, ctx, reservation, regions)

    async def decode(self, body: bytes | bytearray, head_length: str | None, model: str, version: str,
                     keep_raw: bool, ctx: RequestContext, reservation: Reservation
                     ) -> tuple[InferRequest, shm.Plan | None]:
        """The request with its shared-memory inputs read, and the regions of
        its outputs. Decoded even when the bytes will be forwarded: the checks
        (and their errors) stay the gateway's, and mirrors, splits to other
        protocols and the statistics need the tensors. Big bodies are decoded
        in the offload pool, never on the loop."""
        started = time.perf_counter()
        limits = self.services.config.limits
        offload = self.services.offload
        request = await offload.run(len(body), self._decode, body, head_length, model, version, keep_raw, limits,
                                    reservation.grow)
        self._decoded(request, ctx)
        regions = None
        if shm.named(request):  # shared memory only when a tensor names a region: one check, no awaits otherwise
            try:
                regions = await self.extensions.shm_plan(request, ctx)
                await shm.run_inputs(request, regions, TensorAllowance.of(limits), reservation.grow, offload)
            except GatewayError as error:
                raise self._refused(error, request) from None
        ctx.record.decode_seconds = time.perf_counter() - started
        return request, regions

    async def answer(self, response: InferResponse, request: InferRequest | None, route: Route | None,
                     ctx: RequestContext, reservation: Reservation, regions: shm.Plan | None) -> Answer:
        """The answer to ``response``; outputs asked in shared memory are
        written there first."""
        started = time.perf_counter()
        if regions is not None:
            await shm.run_outputs(response, regions, reservation.grow, self.services.offload)
        reply = self._relayed(response, request, route, ctx)
        if reply is None:
            size = self._answer_size(response, request, route)
            reservation.grow(size)  # what encoding builds, charged before it is built
            reply = await self.services.offload.run(size, self._encode, response, request, route, ctx)
        ctx.record.encode_seconds += time.perf_counter() - started
        return reply


def _let_go(request: InferRequest) -> None:
    """Drop what holds the client's body: its bytes and the decoded inputs
    (cleared in place: the data plane's copies of the request share them;
    an upstream client calls this only when no mirror reads them)."""
    request.inputs.clear()
    request.raw = None
