"""Body-sized work off the event loop (docs/architecture.md, "The loop rule").

The loop is shared by every listener and the health probes, so no step of
one request may hold it for more than a few milliseconds. Work proportional
to a body (decoding, encoding, inflating, scanning) goes to a small pool of
threads when the body is big enough for it to matter:

- C code that releases the GIL (zlib, numpy's loops) runs there in parallel
  with the loop;
- pure-Python loops (splitting BYTES elements) run there too, and the
  interpreter hands the GIL back to the loop every switch interval (0.2 ms
  while the pool works), so the loop keeps serving while they run.

Small bodies stay on the loop: a hop to a thread costs tens of
microseconds, more than decoding a small request.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

# Bodies from this size on are decoded and encoded in the pool.
OFFLOAD_MIN_BYTES = 64 << 10
DEFAULT_THREADS = 2
# How long a pool thread running Python may keep the GIL while the loop
# waits for it, while the pool works. The loop gives the GIL up in every
# system call (accept, recv, send, the poll) and waits up to this long to
# take it back, several times per request: at CPython's default (5 ms) a
# health probe took 40-80 ms behind a busy decoder, at 1 ms 25-50 ms, at
# 0.2 ms 8-17 ms (tests/peers/stall_attack.py, BYTES elements). Only while
# the pool works: at other times a short interval costs switches with
# grpc's poller thread for nothing (~0.09 ms per gRPC call at 1 ms).
BUSY_SWITCH_INTERVAL = 0.0002


class Offloader:
    """A bounded pool for body-sized work; one per worker process.

    The pool's queue is bounded by what admits requests in the first place
    (the memory budget and the listeners' request limits), not here.
    """

    def __init__(self, threads: int = DEFAULT_THREADS, min_bytes: int = OFFLOAD_MIN_BYTES) -> None:
        self.min_bytes = min_bytes
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._busy_lock = threading.Lock()
        self._busy = 0  # pool calls under way
        self._gc_was_enabled = False
        self._idle_switch_interval = sys.getswitchinterval()

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:  # made on first use: most configs never need it
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="gateway-offload")
        return self._pool

    async def run(self, size: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``: inline when ``size`` (the bytes it works
        on) is small, else in the pool while the loop goes on."""
        if size < self.min_bytes:
            return fn(*args, **kwargs)
        call = functools.partial(self._in_pool, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor(), call)

    def _in_pool(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn`` with the cycle collector paused and the short switch
        interval on. Decoding a big JSON text makes millions of lists in one
        C call that holds the GIL, and each full collection it triggers
        walks them all again (measured: 1.2 s instead of 0.24 s for 4 M
        lists). Nothing decoded here is cyclic."""
        with self._busy_lock:
            if self._busy == 0:
                self._gc_was_enabled = gc.isenabled()
                gc.disable()
                self._idle_switch_interval = sys.getswitchinterval()
                sys.setswitchinterval(BUSY_SWITCH_INTERVAL)
            self._busy += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with self._busy_lock:
                self._busy -= 1
                if self._busy == 0:
                    sys.setswitchinterval(self._idle_switch_interval)
                    if self._gc_was_enabled:
                        gc.enable()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
