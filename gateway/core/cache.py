"""A small bounded cache with expiry, for what many requests need but rarely
changes: model sizes and capabilities (UM-Bridge), model configurations
(the Triton extensions)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class TtlCache(Generic[T]):
    def __init__(self, ttl: float, max_entries: int = 1024) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, tuple[float, T]] = OrderedDict()

    async def get(self, key: Hashable, load: Callable[[], Awaitable[T]]) -> T:
        """The cached value, or ``load()``'s (errors are not cached)."""
        now = time.monotonic()
        entry = self._entries.get(key)
        if entry is not None and entry[0] > now:
            return entry[1]
        value = await load()
        if self.ttl > 0:
            self._entries[key] = (now + self.ttl, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        self._entries.clear()
