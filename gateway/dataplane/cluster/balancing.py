"""Load balancing: which of the candidate endpoints takes an attempt.

One small class per ``load_balancing.policy``; pure (no I/O, no clock). The
cluster (gateway/dataplane/cluster/cluster.py) narrows the endpoints to the
candidates (available, with a free slot, not yet tried) and asks its picker
only when more than one is left.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable
from typing import Protocol

from gateway.core.hashing import stable_hash
from gateway.dataplane.cluster.endpoint import Endpoint

RING_POINTS_PER_ENDPOINT = 160  # enough for an even spread over a few endpoints


class Picker(Protocol):
    def choose(self, endpoints: list[Endpoint], candidates: list[Endpoint], key: str | None) -> Endpoint:
        """One of ``candidates`` (two or more, all in ``endpoints``, the
        cluster's list); ``key`` is the request's hash key, if any."""

    def rebuild(self, endpoints: list[Endpoint]) -> None:
        """The cluster's endpoints changed (DNS discovery)."""


class RoundRobin:
    """The next candidate after the last one chosen, in the cluster's order."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def choose(self, endpoints: list[Endpoint], candidates: list[Endpoint], key: str | None) -> Endpoint:
        allowed = set(map(id, candidates))
        count = len(endpoints)
        for step in range(count):
            index = (self._next + step) % count
            if id(endpoints[index]) in allowed:
                self._next = index + 1
                return endpoints[index]
        return candidates[0]  # unreachable: candidates come from endpoints

    def rebuild(self, endpoints: list[Endpoint]) -> None:
        pass  # the position carries over


class LeastRequest:
    """The less busy of two random candidates (power of two choices)."""

    __slots__ = ("_rng",)

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(self, endpoints: list[Endpoint], candidates: list[Endpoint], key: str | None) -> Endpoint:
        first, second = self._rng.sample(candidates, 2)
        return first if first.in_flight <= second.in_flight else second

    def rebuild(self, endpoints: list[Endpoint]) -> None:
        pass


class LoadAware:
    """The less loaded of two random candidates (power of two choices), by
    the load each endpoint reports (loadmetrics.py) plus this gateway's
    calls since it was read, so load from other gateways and from clients
    calling the endpoints directly counts. While either load is unknown
    (not read yet, or stale): least_request, and ``on_fallback`` is told."""

    __slots__ = ("_on_fallback", "_rng")

    def __init__(self, rng: random.Random, on_fallback: Callable[[], None]) -> None:
        self._rng = rng
        self._on_fallback = on_fallback

    def choose(self, endpoints: list[Endpoint], candidates: list[Endpoint], key: str | None) -> Endpoint:
        first, second = self._rng.sample(candidates, 2)
        first_load, second_load = first.load, second.load
        if first_load is None or second_load is None:
            self._on_fallback()
            return first if first.in_flight <= second.in_flight else second
        return first if first.estimated_load(first_load) <= second.estimated_load(second_load) else second

    def rebuild(self, endpoints: list[Endpoint]) -> None:
        pass


class RingHash:
    """The first candidate clockwise from the key's hash on a ring of points
    per endpoint, so losing an endpoint moves only its keys; a random
    candidate for a request without the key."""

    __slots__ = ("_owners", "_points", "_rng")

    def __init__(self, rng: random.Random, endpoints: list[Endpoint]) -> None:
        self._rng = rng
        self._points: list[int] = []
        self._owners: list[Endpoint] = []  # the endpoint of each point
        self.rebuild(endpoints)

    def rebuild(self, endpoints: list[Endpoint]) -> None:
        ring = sorted((stable_hash(f"{e.address}#{i}"), index)
                      for index, e in enumerate(endpoints) for i in range(RING_POINTS_PER_ENDPOINT))
        self._points = [point for point, _ in ring]
        self._owners = [endpoints[index] for _, index in ring]

    def choose(self, endpoints: list[Endpoint], candidates: list[Endpoint], key: str | None) -> Endpoint:
        if key is None:
            return self._rng.choice(candidates)
        allowed = set(map(id, candidates))
        owners = self._owners
        start = bisect.bisect_left(self._points, stable_hash(key))
        for step in range(len(owners)):
            endpoint = owners[(start + step) % len(owners)]
            if id(endpoint) in allowed:
                return endpoint
        return candidates[0]  # unreachable: every endpoint has ring points


def picker(policy: str, rng: random.Random, endpoints: list[Endpoint],
           on_fallback: Callable[[], None] = lambda: None) -> Picker:
    """The picker of ``policy`` (one of config's LOAD_BALANCING_POLICIES);
    ``on_fallback``: load_aware picked by least_request (a load unknown)."""
    if policy == "least_request":
        return LeastRequest(rng)
    if policy == "load_aware":
        return LoadAware(rng, on_fallback)
    if policy == "consistent_hash":
        return RingHash(rng, endpoints)
    return RoundRobin()
