"""Where the response cache keeps answers: a backend is one small class
(:class:`CacheBackend`); ``memory`` keeps them in this worker, ``redis``
(cache_redis.py) in the `redis:` server.

An answer is kept as tensors, never as an upstream's bytes (those carry the
first request's id and model name): each hit is encoded anew for the request
that asks. The memory backend copies the answer's arrays (owned, read-only:
nothing a later request does can change a kept answer), is bounded by
``max_bytes`` (least recently used answers go first), forgets answers
``ttl`` after they were stored, and charges what it keeps to the worker's
memory budget (limits.max_inflight_bytes: one reservation, grown and
shrunk with it) until it lets go of it: on eviction, expiry or close. An answer larger than ``max_bytes``, or one the
budget has no room for, is not kept (the request is answered all the same).
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final, Protocol

import numpy as np

from gateway.core.errors import GatewayError
from gateway.core.types import InferRequest, InferResponse, Tensor
from gateway.dataplane.filters.cache_key import rough_size
from gateway.runtime.budget import InflightBudget
from gateway.runtime.offload import Offloader

# What an entry costs beyond its arrays: the table slot, its key, the entry
# and its response parameters (CPython, rounded up) ...
ENTRY_BYTES = 512
# ... each tensor's tuple, name, shape and parameters ...
TENSOR_BYTES = 256
# ... and each BYTES element's Python object beyond its bytes.
BYTES_ELEMENT_BYTES = sys.getsizeof(b"") + 8  # the object head and its slot in the array

# A kept tensor: (name, datatype, shape, read-only array, parameters as items).
KeptTensor = tuple[str, str, tuple[int, ...], np.ndarray, tuple[tuple[str, Any], ...]]


# A kept answer: (expires, size, model version, tensors, parameters as
# items). Plain tuples of strings, numbers and arrays only: the cycle
# collector stops tracking them, so what a full collection (which holds
# the loop) walks per kept answer is one table slot, not five objects.
# Measured, 200,000 answers of `simple` (222 MiB): a full collection took
# 170 ms with answers kept as objects, 45 ms as plain tuples, 4 ms empty.
CachedAnswer = tuple[float, int, str, tuple[KeptTensor, ...], tuple[tuple[str, Any], ...]]
EXPIRES: Final = 0  # positions in a CachedAnswer
SIZE: Final = 1


def answer_to(kept: CachedAnswer, request: InferRequest) -> InferResponse:
    """A kept answer as ``request``'s own: its id and model name; new tensor
    objects over the kept arrays (frontends may change a tensor's fields,
    never its data)."""
    _, _, model_version, outputs, parameters = kept
    return InferResponse(
        request.model_name, model_version, request.id,
        [Tensor(name, datatype, shape, data, dict(items)) for name, datatype, shape, data, items in outputs],
        dict(parameters))


class CacheUnavailable(Exception):
    """A look-up found no answer because the backend could not answer (the
    request is a miss whose answer is not stored)."""


class CacheBackend(Protocol):
    """What the response cache asks of where it keeps answers."""

    async def get(self, key: bytes) -> CachedAnswer | None:
        """The answer kept under ``key``, None when there is none (or it is
        unusable); raises CacheUnavailable when the backend cannot answer."""
        ...

    async def put(self, key: bytes, response: InferResponse) -> bool:
        """Keep ``response`` under ``key``; False when it is not kept."""
        ...

    async def close(self) -> None: ...


def answer_size(outputs: list[Tensor]) -> int:
    """What keeping ``outputs`` costs in memory (an upper estimate)."""
    size = ENTRY_BYTES
    for tensor in outputs:
        size += TENSOR_BYTES + len(tensor.name)
        data = tensor.data
        if tensor.datatype == "BYTES":
            size += data.size * BYTES_ELEMENT_BYTES + sum(len(item) for item in data.reshape(-1))
        else:
            size += data.nbytes
    return size


def kept_tensors(outputs: list[Tensor]) -> tuple[KeptTensor, ...]:
    """The outputs over arrays of their own, read-only (a view would keep
    the whole upstream reply alive, and could change under the cache)."""
    kept = []
    for tensor in outputs:
        data = np.array(tensor.data, copy=True, order="C")
        data.flags.writeable = False
        kept.append((tensor.name, tensor.datatype, tensor.shape, data, tuple(tensor.parameters.items())))
    return tuple(kept)


class MemoryBackend:
    """Answers kept in this worker, least recently used first out."""

    def __init__(self, ttl: float, max_bytes: int, budget: InflightBudget, offload: Offloader,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.max_bytes = max_bytes
        self.used = 0  # bytes kept, all charged to the budget by one reservation
        self._held = budget.reserve()
        self._offload = offload
        self._clock = clock
        self._entries: OrderedDict[bytes, CachedAnswer] = OrderedDict()  # least recently used first
        self._closed = False

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: bytes) -> CachedAnswer | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[EXPIRES] <= self._clock():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry

    async def put(self, key: bytes, response: InferResponse) -> bool:
        rough = rough_size(response.outputs)
        size = await self._offload.run(rough, answer_size, response.outputs)
        if size > self.max_bytes or self._closed:
            return False
        try:
            self._held.grow(size)  # held from before the copy is made
        except GatewayError:  # the budget has no room now: answered, not kept
            return False
        try:
            outputs = await self._offload.run(rough, kept_tensors, response.outputs)
        except BaseException:
            self._held.shrink(size)
            raise
        if self._closed:  # closed while the copy was made
            self._held.shrink(size)
            return False
        if key in self._entries:  # another request's answer to the same question came first
            self._drop(key)
        self._entries[key] = (self._clock() + self.ttl, size, response.model_version, outputs,
                              tuple(response.parameters.items()))
        self.used += size
        self._forget_expired()
        while self.used > self.max_bytes:
            self._drop(next(iter(self._entries)))
        return True

    def _forget_expired(self) -> None:
        """Give back what expired answers hold, from the least recently used
        on, up to the first one still fresh (an expired answer deeper in is
        never served: :meth:`get` drops it, or its turn comes)."""
        now = self._clock()
        while self._entries:
            oldest = next(iter(self._entries))
            if self._entries[oldest][EXPIRES] > now:
                return
            self._drop(oldest)

    def _drop(self, key: bytes) -> None:
        entry = self._entries.pop(key)
        self.used -= entry[SIZE]
        self._held.shrink(entry[SIZE])

    async def close(self) -> None:
        self._closed = True
        self._entries.clear()
        self.used = 0
        self._held.release()
