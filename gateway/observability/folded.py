"""Metrics kept as plain numbers: the per-request series of a gateway that
runs as one process.

prometheus-client keeps each value behind a lock (its ``MutexValue``) so
that any thread may record, and every ``inc`` and ``observe`` takes it. The
per-request series are recorded only by the event loop's thread, and scraped
on it (the admin server shares the loop), so these classes are
prometheus-client's own with the lock-free :class:`PlainValue` in its place
and the recording methods cut to the arithmetic: names, labels, buckets,
HELP texts, ``_created`` series and the exposition are prometheus-client's,
and a scrape sees every request finished before it.

With several workers (multiprocess mode) the values must live in the shared
files prometheus-client writes: :class:`GatewayMetrics` uses its classes then.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import Any

from prometheus_client import Counter, Gauge, Histogram


class PlainValue:
    """A metric value without a lock (prometheus-client's value interface)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float) -> None:
        self.value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self.value = float(value)

    def get(self) -> float:
        return self.value

    def get_exemplar(self) -> None:
        return None


class FoldedCounter(Counter):
    """A Counter recorded from one thread only."""

    def _metric_init(self) -> None:
        self._value: Any = PlainValue()
        self._created = time.time()

    def inc(self, amount: float = 1, exemplar: Any = None) -> None:
        self._value.value += amount


class FoldedGauge(Gauge):
    """A Gauge set from one thread only."""

    def _metric_init(self) -> None:
        self._value: Any = PlainValue()

    def inc(self, amount: float = 1) -> None:
        self._value.value += amount

    def dec(self, amount: float = 1) -> None:
        self._value.value -= amount

    def set(self, value: float) -> None:
        self._value.value = float(value)


class FoldedHistogram(Histogram):
    """A Histogram observed from one thread only."""

    def _metric_init(self) -> None:
        self._created = time.time()
        self._sum: Any = PlainValue()
        self._buckets: Any = [PlainValue() for _ in self._upper_bounds]

    def observe(self, amount: float, exemplar: Any = None) -> None:
        self._sum.value += amount
        # The first bucket whose bound is at least the amount (the last is +Inf).
        self._buckets[bisect_left(self._upper_bounds, amount)].value += 1
