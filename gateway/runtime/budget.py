"""The memory budget: bytes of bodies and decoded tensors in flight, per
worker (like Envoy's overload manager).

Each request holds a :class:`Reservation` from the moment its size is known
(a Content-Length, a gRPC message) and grows it as it learns more (inflated
bytes, what decoding a JSON body will build) before it allocates that much.
Past the budget the request is refused at once (:class:`Saturated`), never
queued; everything a request reserved is given back when it ends.
docs/security.md gives the worst-case memory per worker as a formula.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.core.errors import Saturated, too_large
from gateway.core.limits import check_depth, count_bytes, scan_json, whole_bytes
from gateway.runtime.offload import Offloader

if TYPE_CHECKING:
    from gateway.config.limits import Limits

# What decoding a JSON text builds beyond the text itself, per value
# (a Python float or str and its list slot, ~32-60 bytes) and per array or
# object (56-232 bytes): an upper estimate, so a body of a million empty
# lists cannot cost 20 times its size unannounced.
JSON_BYTES_PER_VALUE = 48
JSON_BYTES_PER_CONTAINER = 128
# A small body is charged this many times its size, unscanned: more than
# any JSON text can build (an empty list, 3 bytes with its comma, is ~64).
SMALL_JSON_FACTOR = 24


def json_decode_cost(values: int, containers: int) -> int:
    return values * JSON_BYTES_PER_VALUE + containers * JSON_BYTES_PER_CONTAINER


class InflightBudget:
    """One worker's budget of bytes in flight."""

    def __init__(self, limit: int, on_refusal: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.used = 0  # sampled into the gateway_inflight_bytes gauge
        self._lock = threading.Lock()  # decoders in the offload pool charge too
        self._on_refusal = on_refusal or (lambda: None)  # the refusal counter

    def reserve(self) -> Reservation:
        """An empty reservation, grown as the request learns what it needs."""
        return Reservation(self)

    def _take(self, reservation: Reservation, size: int) -> None:
        if reservation.size + size > self.limit:  # never fits, however idle the gateway: no retry helps
            raise too_large(f"the request needs {reservation.size + size} bytes in flight, over "
                            f"limits.max_inflight_bytes ({self.limit})")
        with self._lock:  # the check and the charge, against a release on another thread
            if reservation.released:
                raise Released
            fits = self.used + size <= self.limit
            if fits:
                self.used += size
                reservation.size += size
        if not fits:
            self._on_refusal()
            raise Saturated("the gateway is at its memory budget for requests in flight "
                            f"(limits.max_inflight_bytes, {self.limit} bytes); retry later")

    def _give_back(self, reservation: Reservation) -> None:
        with self._lock:
            self.used -= reservation.size
            reservation.size, reservation.released = 0, True

    def _give_back_part(self, reservation: Reservation, size: int) -> None:
        with self._lock:
            size = min(size, reservation.size)
            self.used -= size
            reservation.size -= size


class Released(Exception):
    """A reservation was grown after its request ended: a decoder in the
    offload pool still running for a request that was cancelled (the pool
    cannot stop it). Raised to stop that work; it charges nothing, so the
    budget cannot leak what nobody will release."""


class Reservation:
    """What one request holds of the budget; released once, when it ends
    (a released reservation takes nothing more: :class:`Released`)."""

    __slots__ = ("_budget", "released", "size")

    def __init__(self, budget: InflightBudget) -> None:
        self._budget = budget
        self.size = 0
        self.released = False

    @property
    def budget_limit(self) -> int:
        return self._budget.limit

    def grow(self, size: int) -> None:
        """Hold ``size`` more bytes, or raise Saturated holding nothing more."""
        if size > 0:
            self._budget._take(self, size)

    def release(self) -> None:
        if not self.released:
            self._budget._give_back(self)

    def shrink(self, size: int) -> None:
        """Give back ``size`` bytes of what it holds and keep the rest: state
        kept between requests (a cache) lets go of part of itself."""
        if size > 0 and not self.released:
            self._budget._give_back_part(self, size)


async def admit_json(body: bytes | bytearray | memoryview, reservation: Reservation, offload: Offloader,
                     limits: Limits, what: str) -> None:
    """Check a JSON text's nesting and size and charge what parsing it will
    build, before anything parses it. Big texts are scanned in the pool."""
    size = len(body)
    text = whole_bytes(body)
    small = size < offload.min_bytes
    opens, commas = _counts(text) if small else await offload.run(size, _counts, text)
    if opens <= min(limits.max_json_depth, limits.max_json_containers):
        # Within both bounds whatever the strings hold. Commas in strings
        # make the count larger than the values: good enough unless that
        # could matter (a big text of comma-separated strings is scanned).
        cost = size * SMALL_JSON_FACTOR if small else json_decode_cost(commas + 1, opens)
        if small or cost <= reservation.budget_limit // 4:
            reservation.grow(cost)
            return
    shape = await offload.run(size, scan_json, body)
    check_depth(shape.depth, limits.max_json_depth, what)
    if shape.containers > limits.max_json_containers:
        raise too_large(f"{what} holds {shape.containers} JSON arrays and objects, over "
                        f"limits.max_json_containers ({limits.max_json_containers})")
    reservation.grow(size * SMALL_JSON_FACTOR if small else json_decode_cost(shape.values, shape.containers))


def _counts(text: bytes | bytearray) -> tuple[int, int]:
    """Opening brackets and commas, strings included."""
    arrays, objects, commas = count_bytes(text, b"[{,")
    return arrays + objects, commas

