"""Triton-style inference statistics per model and version.

One accumulator for the whole gateway, fed by ``observe.finish_request``
with the same record and duration the Prometheus metrics get, so the two
can never disagree. Only requests the data plane routed as an inference
count (``record.batch_size`` set); the model and version are the ones the
client named, kept apart by the route that took them: a listener is shown
the counts of the routes it resolves to (``snapshot``'s ``visible``), so two
tenants' models of one name never share numbers, and a tenant never sees
the models of another's listener.

What each number means here (the gateway computes them; an upstream
Triton's own statistics are not forwarded):

- success / fail: requests answered / failed, with their end-to-end time at
  the gateway (the ``gateway_request_duration_seconds`` observation);
- queue: time waiting for an upstream slot (the circuit breaker's line);
- compute_input: translating the request (frontend decode);
- compute_infer: the upstream call(s), backend translation included;
- compute_output: translating the response (frontend encode);
- inference_count: batch elements of successful requests; execution_count:
  successful requests (each is one upstream execution as the gateway sees it);
- cache_hit / cache_miss: requests a route's response cache answered / did
  not, with the time of the look-up (and, on a miss, of storing the answer).
  As in Triton, a hit counts in success and queue but computes nothing: no
  compute_*, inference_count, execution_count or batch statistics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.core.record import CACHE_HIT, CACHE_MISS, OUTCOME_OK, RequestRecord

MODEL_NOT_FOUND_OUTCOME = "model_not_found"  # ErrorKind.MODEL_NOT_FOUND.value
MAX_BATCH_SIZES = 64  # distinct batch sizes tracked per model and version


def batch_size(inputs: list[Any]) -> int:
    """A request's batch size as the gateway can tell without asking the
    model: the leading dimension of the inputs when every input has at
    least two dimensions and they agree on it, else 1."""
    size = None
    for tensor in inputs:
        shape = tensor.shape
        if len(shape) < 2 or (size is not None and shape[0] != size):
            return 1
        size = shape[0]
    return 1 if size is None else int(size)


@dataclass(slots=True)
class Duration:
    """How often something happened and how long it took in total."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        if seconds > 0:  # a clock step back counts as nothing
            self.ns += round(seconds * 1e9)


@dataclass(slots=True)
class BatchStatistics:
    batch_size: int
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ModelStatistics:
    name: str
    version: str
    last_inference_ms: int = 0  # since the epoch
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    batches: dict[int, BatchStatistics] = field(default_factory=dict)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)

    def copy(self) -> ModelStatistics:
        """A snapshot that later requests do not change."""
        def dup(d: Duration) -> Duration:
            return Duration(d.count, d.ns)

        return ModelStatistics(
            self.name, self.version, self.last_inference_ms, self.inference_count, self.execution_count,
            dup(self.success), dup(self.fail), dup(self.queue), dup(self.compute_input), dup(self.compute_infer),
            dup(self.compute_output),
            {size: BatchStatistics(size, dup(b.compute_input), dup(b.compute_infer), dup(b.compute_output))
             for size, b in sorted(self.batches.items())},
            dup(self.cache_hit), dup(self.cache_miss))


# Whether the asker may see the accumulator of (model, version, route).
Visible = Callable[[str, str, str], bool]


class StatisticsStore:
    """Per (model, version, route) accumulators; at most ``max_models`` of
    them (the metrics' model cap), so clients cannot grow it without bound."""

    def __init__(self, max_models: int = 100, clock: Callable[[], float] = time.time) -> None:
        self.max_models = max_models
        self._clock = clock
        self._models: dict[tuple[str, str, str], ModelStatistics] = {}

    def observe(self, record: RequestRecord, duration: float) -> None:
        """Account one finished request (``finish_request`` calls this)."""
        if record.batch_size is None or not record.model or record.outcome == MODEL_NOT_FOUND_OUTCOME:
            return  # not an inference, or one for a model nobody serves
        key = (record.model, record.version, record.route)
        stats = self._models.get(key)
        if stats is None:
            if len(self._models) >= self.max_models:
                return
            stats = self._models[key] = ModelStatistics(record.model, record.version)
        stats.last_inference_ms = max(stats.last_inference_ms, int(self._clock() * 1000))
        if record.outcome != OUTCOME_OK:
            stats.fail.add(duration)
            return
        stats.success.add(duration)
        stats.queue.add(record.queue_seconds)
        if record.cache:
            if record.cache == CACHE_HIT:
                stats.cache_hit.add(record.cache_seconds)
                return
            if record.cache == CACHE_MISS:
                stats.cache_miss.add(record.cache_seconds)
        stats.compute_input.add(record.decode_seconds)
        stats.compute_infer.add(record.upstream_seconds)
        stats.compute_output.add(record.encode_seconds)
        stats.inference_count += record.batch_size
        stats.execution_count += 1
        batch = stats.batches.get(record.batch_size)
        if batch is None and len(stats.batches) < MAX_BATCH_SIZES:
            batch = stats.batches[record.batch_size] = BatchStatistics(record.batch_size)
        if batch is not None:
            batch.compute_input.add(record.decode_seconds)
            batch.compute_infer.add(record.upstream_seconds)
            batch.compute_output.add(record.encode_seconds)

    def snapshot(self, model: str = "", version: str = "", visible: Visible | None = None) -> list[ModelStatistics]:
        """Copies of the accumulators of ``model`` (every model when empty),
        of ``version`` (every version when empty), that ``visible`` admits
        (all without it), sorted by name."""
        return [stats.copy() for (name, ver, route), stats in sorted(self._models.items())
                if (not model or name == model) and (not version or ver == version)
                and (visible is None or visible(name, ver, route))]
