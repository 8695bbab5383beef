"""Sequence affinity: every request of one sequence to one endpoint.

A stateful model keeps a sequence's state on the endpoint that served its
START request, so later requests must go there too, whatever the load
balancer would pick, and whichever gateway replica or worker they reach.
The endpoint is a function of the sequence's id and the available endpoints
(rendezvous hashing, Cluster.sequence_endpoint), so replicas agree without
sharing state. Each process also keeps a table of the sequences it served:
a pin is made when a request is answered, refreshed by every later one, and
dropped by the END request or by idleness. It holds a running sequence on
its endpoint when an endpoint joins (the hash would move some), and ends it
with a clear error when its endpoint leaves, rather than moving it: the new
endpoint would not have its state."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config.upstreams import SequenceAffinity

SEQUENCE_ID = "sequence_id"
SEQUENCE_START = "sequence_start"
SEQUENCE_END = "sequence_end"


@dataclass(frozen=True, slots=True)
class SequenceStep:
    """Where one request stands in its sequence."""

    key: str  # the correlation id as text, typed so 7 and "7" differ
    start: bool
    end: bool


def sequence_step(parameters: Mapping[str, Any]) -> SequenceStep | None:
    """The request's place in a sequence, or None for a request outside one
    (no id, id 0 or ""). Malformed controls are left to the model to refuse."""
    raw = parameters.get(SEQUENCE_ID)
    if isinstance(raw, bool) or not isinstance(raw, int | str) or raw == 0 or raw == "":
        return None
    key = f"i:{raw}" if isinstance(raw, int) else f"s:{raw}"
    return SequenceStep(key, parameters.get(SEQUENCE_START) is True, parameters.get(SEQUENCE_END) is True)


class SequencePins:
    """Correlation id -> endpoint address, least recently used first."""

    def __init__(self, settings: SequenceAffinity | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings or SequenceAffinity()
        self._clock = clock
        self._pins: collections.OrderedDict[str, tuple[str, float]] = collections.OrderedDict()

    def __len__(self) -> int:
        self._expire(self._clock())
        return len(self._pins)

    def endpoint_of(self, key: str) -> str | None:
        """The pinned endpoint's address, refreshing the pin."""
        now = self._clock()
        self._expire(now)
        pin = self._pins.pop(key, None)
        if pin is None:
            return None
        self._pins[key] = (pin[0], now)
        return pin[0]

    def pin(self, key: str, address: str) -> None:
        now = self._clock()
        self._expire(now)
        self._pins.pop(key, None)
        self._pins[key] = (address, now)
        while len(self._pins) > self.settings.max_sequences:
            self._pins.popitem(last=False)

    def unpin(self, key: str) -> None:
        self._pins.pop(key, None)

    def _expire(self, now: float) -> None:
        horizon = now - self.settings.idle_timeout
        while self._pins:
            key = next(iter(self._pins))
            if self._pins[key][1] > horizon:
                break
            del self._pins[key]
