"""The line of requests waiting for a slot of a cluster, by priority.

Priority 1 is the highest; 0 means the request gave none (nor did its
route) and ranks below every level. The first in line is the oldest waiter
of the highest priority present; when the line is full, the newest waiter
of the lowest priority present is shed first, and only for a newcomer of a
higher priority (else the newcomer is refused), so a higher priority is
never shed while a lower one waits.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
from collections.abc import Iterator

from gateway.config.routes import MAX_PRIORITY
from gateway.core.errors import GatewayError

NO_PRIORITY_RANK = MAX_PRIORITY + 1  # the rank of priority 0: below every level


def rank_of(priority: int) -> int:
    """The sort rank of ``priority`` (lower ranks go first); above
    MAX_PRIORITY a level counts as MAX_PRIORITY."""
    return NO_PRIORITY_RANK if priority <= 0 else min(priority, MAX_PRIORITY)


class Waiter:
    """One request waiting; its future is set when it may try to take a slot."""

    __slots__ = ("future", "priority", "rank", "refused")

    def __init__(self, priority: int) -> None:
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.priority = min(max(priority, 0), MAX_PRIORITY)
        self.rank = rank_of(priority)
        self.refused: GatewayError | None = None  # set when shed for a higher priority


class WaitLine:
    """Waiters by rank, first come first served within one rank."""

    __slots__ = ("_levels", "_ranks", "size")

    def __init__(self) -> None:
        self._levels: dict[int, collections.deque[Waiter]] = {}
        self._ranks: list[int] = []  # the ranks present, ascending
        self.size = 0  # waiters in line (an attribute: every acquire and release reads it)

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[Waiter]:
        """In the order they go: highest priority first, oldest first."""
        for rank in self._ranks:
            yield from self._levels[rank]

    def add(self, waiter: Waiter) -> None:
        level = self._levels.get(waiter.rank)
        if level is None:
            level = self._levels[waiter.rank] = collections.deque()
            bisect.insort(self._ranks, waiter.rank)
        level.append(waiter)
        self.size += 1

    def remove(self, waiter: Waiter) -> None:
        """Take ``waiter`` out of the line, if it is still in it."""
        level = self._levels.get(waiter.rank)
        if level is None:
            return
        try:
            level.remove(waiter)
        except ValueError:
            return
        self.size -= 1
        if not level:
            del self._levels[waiter.rank]
            self._ranks.remove(waiter.rank)

    def victim_for(self, rank: int) -> Waiter | None:
        """The waiter to shed for a newcomer of ``rank``: the newest one not
        yet woken of the lowest priority present, if that is lower than the
        newcomer's; else None (the newcomer is the one to refuse)."""
        for lowest in reversed(self._ranks):
            if lowest <= rank:
                return None
            for waiter in reversed(self._levels[lowest]):
                if not waiter.future.done():
                    return waiter
        return None
