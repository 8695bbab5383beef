"""How late the event loop runs what is due: ``gateway_event_loop_lag_seconds``.

One monitor task per event loop sleeps a fixed interval and observes how
much later than asked it woke. Whatever held the loop meanwhile (a
synchronous step of some request, a blocking call) shows as lag, so the
histogram's tail is the longest time a request on any listener of this
process may have waited for the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

# Short enough to catch stalls of tens of milliseconds often, long enough to
# cost nothing (20 wake-ups a second).
INTERVAL = 0.05


class LoopLagMonitor:
    """``start()`` on the running loop; ``await stop()`` ends it."""

    def __init__(self, observe: Callable[[float], None], interval: float = INTERVAL,
                 sample: Callable[[], None] | None = None) -> None:
        self._observe = observe
        self.interval = interval
        # Also the tick of gauges sampled rather than set on every change (the
        # memory budget in use changes several times per request).
        self._sample = sample or (lambda: None)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="event loop lag monitor")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            asked = time.monotonic() + self.interval
            await asyncio.sleep(self.interval)
            # A timer may fire up to the clock's resolution early: no negative lag.
            self._observe(max(0.0, time.monotonic() - asked))
            self._sample()
