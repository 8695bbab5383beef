"""Stateful (sequence) demo models: Triton's sequence examples, embedded.

A sequence is the requests that share a correlation id (the request
parameter ``sequence_id``: a non-zero integer or a non-empty string),
opened by ``sequence_start`` and closed by ``sequence_end``. Each model keeps
its state per live sequence, in this process: state does not cross worker
processes or survive a reload (docs/protocols.md, "Sequences").

State is what the model needs and no more: nothing for ``simple_sequence``
and ``simple_dyna_sequence`` (their answers depend on the current request
only), the running sum (one int64 per row) for
``simple_string_dyna_sequence``. It is bounded per model in bytes
(``sequences.max_state_bytes``) and charged to the worker's memory budget
while the sequence lives; the charge is given back when the sequence ends,
expires, restarts with a new size, or the upstream closes (reload,
shutdown).

The arithmetic is what Triton's example clients check, step by step
(simple_{http,grpc}_sequence_*_client.py with and without ``--dyna``):

- ``simple_sequence``: OUTPUT = INPUT, plus 1 on the START request;
- ``simple_dyna_sequence``: the same, plus the correlation id on the END
  request (an integer id);
- ``simple_string_dyna_sequence``: a running sum of INPUT, plus the
  correlation id on the END request (a string id that reads as an integer).
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.core.errors import ErrorKind, GatewayError, invalid, too_large
from gateway.core.types import InferRequest, Tensor, TensorSpec
from gateway.dataplane.affinity import SEQUENCE_END, SEQUENCE_ID, SEQUENCE_START
from gateway.protocols.builtin.models import BuiltinModel
from gateway.runtime.budget import InflightBudget, Reservation

DEFAULT_IDLE_SECONDS = 60.0
DEFAULT_MAX_SEQUENCES = 1024
DEFAULT_MAX_STATE_BYTES = 16 << 20
# What a live sequence costs beyond its state array and its id: the table
# entry, its record and its reservation (CPython, rounded up).
ENTRY_BYTES = 256
INT32_MIN, INT32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)


@dataclass(frozen=True, slots=True)
class SequenceSettings:
    idle_seconds: float = DEFAULT_IDLE_SECONDS  # a sequence idle this long is forgotten
    max_sequences: int = DEFAULT_MAX_SEQUENCES  # live sequences per model; past it new ones are refused
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES  # bytes of state per model, ids included; past it: refused


@dataclass(frozen=True, slots=True)
class SequenceControls:
    correlation_id: int | str
    start: bool
    end: bool


def sequence_controls(parameters: Mapping[str, Any], model: str) -> SequenceControls:
    """The sequence parameters of a request, as Triton reads them."""
    raw = parameters.get(SEQUENCE_ID, 0)
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise invalid(f"the '{SEQUENCE_ID}' parameter must be an integer or a string")
    if raw == 0 or raw == "":
        raise invalid(f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID")
    flags = []
    for name in (SEQUENCE_START, SEQUENCE_END):
        value = parameters.get(name, False)
        if not isinstance(value, bool):
            raise invalid(f"the '{name}' parameter must be a boolean")
        flags.append(value)
    return SequenceControls(raw, flags[0], flags[1])


@dataclass(slots=True)
class _Live:
    """One live sequence: its state, when it was last used, and what it holds
    of the memory budget."""

    state: np.ndarray | None
    last_use: float
    held: Reservation


class SequenceModel(BuiltinModel):
    """INPUT INT32 [-1, 1] -> OUTPUT INT32 [-1, 1], with state per sequence.

    Subclasses say how a step changes the state and what it answers
    (:meth:`step`, :meth:`state_bytes`); this class keeps the sequences:
    START opens (or restarts) one, END closes it, a request of an unknown
    sequence without START is refused, sequences idle past ``idle_seconds``
    are forgotten, and what they hold is bounded and charged to ``budget``.
    """

    inputs = (TensorSpec("INPUT", "INT32", (-1, 1)),)
    outputs = (TensorSpec("OUTPUT", "INT32", (-1, 1)),)

    def __init__(self, name: str, settings: SequenceSettings | None = None,
                 clock: Callable[[], float] = time.monotonic, budget: InflightBudget | None = None) -> None:
        self.name = name
        self.settings = settings or SequenceSettings()
        self._clock = clock
        self._budget = budget or InflightBudget(1 << 62)  # unbudgeted: still counted, never refused by it
        self.held_bytes = 0  # what the live sequences hold, ids and entries included
        # correlation id -> its sequence; ordered by last use, oldest first
        self._live: collections.OrderedDict[int | str, _Live] = collections.OrderedDict()

    def live_sequences(self) -> int:
        self.forget_idle()
        return len(self._live)

    def compute(self, inputs: dict[str, Tensor]) -> list[Tensor]:
        raise invalid(f"model '{self.name}' is a sequence model: requests need a '{SEQUENCE_ID}' parameter")

    def infer(self, request: InferRequest) -> list[Tensor]:
        values = self.check_inputs(request.inputs)["INPUT"].data
        controls = sequence_controls(request.parameters, self.name)
        correlation_id = self.check_correlation_id(controls.correlation_id)
        now = self._clock()
        self.forget_idle(now)
        key = controls.correlation_id
        known = self._live.get(key)
        if known is None and not controls.start:
            raise invalid(f"inference request for sequence {key} to model '{self.name}' must "
                          "specify the START flag on the first request of the sequence")
        if known is None and len(self._live) >= self.settings.max_sequences:
            raise GatewayError(ErrorKind.OVERLOADED, f"model '{self.name}' holds {len(self._live)} live sequences, "
                               "its limit; end sequences or wait for idle ones to expire")
        # Charged before anything is built: a refused step leaves the sequence as it was.
        held = None if controls.end else self._charge(key, known, self.state_bytes(values))
        kept = known is not None and held is known.held
        try:
            state = None if controls.start or known is None else known.state
            state, answer = self.step(state, values.astype(np.int64), controls.start)
        except BaseException:
            if held is not None and not kept:
                held.release()
            raise
        if held is None:
            self._forget(key)
            answer = answer + correlation_id
        elif known is not None and kept:
            known.state, known.last_use = state, now
            self._live.move_to_end(key)
        else:
            self._forget(key)
            self._live[key] = _Live(state, now, held)
            self.held_bytes += held.size
        output = np.clip(answer, INT32_MIN, INT32_MAX).astype(np.int32)
        return [Tensor.from_numpy("OUTPUT", output, "INT32")]

    def _charge(self, key: int | str, known: _Live | None, state_bytes: int) -> Reservation:
        """The reservation the sequence holds after this step: its current one
        when the size is unchanged, else a new one (the caller swaps them)."""
        cost = ENTRY_BYTES + sys.getsizeof(key) + state_bytes
        if known is not None and known.held.size == cost:
            return known.held
        bound = self.settings.max_state_bytes
        if cost > bound:
            raise too_large(f"a sequence of model '{self.name}' would hold {cost} bytes of state, over "
                            f"sequences.max_state_bytes ({bound})")
        others = self.held_bytes - (known.held.size if known is not None else 0)
        if others + cost > bound:
            raise GatewayError(ErrorKind.OVERLOADED, f"model '{self.name}' holds {others} bytes of sequence "
                               f"state; {cost} more would pass sequences.max_state_bytes ({bound}): end "
                               "sequences or wait for idle ones to expire")
        held = self._budget.reserve()
        held.grow(cost)  # past the worker's memory budget: refused (Saturated, or too large)
        return held

    def check_correlation_id(self, correlation_id: int | str) -> int:
        """The id as the number added on END (0 where the model adds none)."""
        return 0

    def _addable(self, number: int) -> int:
        """The END request adds the id to an INT32 output: it must fit."""
        if not INT32_MIN <= number <= INT32_MAX:
            raise invalid(f"model '{self.name}' adds the correlation ID to its INT32 output; {number} does not fit")
        return number

    def state_bytes(self, values: np.ndarray) -> int:
        """The size of the state a step with ``values`` leaves behind."""
        return 0

    def step(self, state: np.ndarray | None, values: np.ndarray,
             start: bool) -> tuple[np.ndarray | None, np.ndarray]:
        """(the new state, the answer) for one request's INPUT (as int64)."""
        return None, values + (1 if start else 0)

    def forget_idle(self, now: float | None = None) -> None:
        """Forget the sequences idle past ``idle_seconds``, giving back what they held."""
        horizon = (self._clock() if now is None else now) - self.settings.idle_seconds
        while self._live:
            oldest = next(iter(self._live))
            if self._live[oldest].last_use > horizon:
                break
            self._forget(oldest)

    def forget_all(self) -> None:
        """Forget every sequence (the upstream closes: reload, shutdown)."""
        while self._live:
            self._forget(next(iter(self._live)))

    def _forget(self, key: int | str) -> None:
        live = self._live.pop(key, None)
        if live is not None:
            self.held_bytes -= live.held.size
            live.held.release()


class DynaSequence(SequenceModel):
    """simple_dyna_sequence: the END request adds its integer correlation id."""

    def check_correlation_id(self, correlation_id: int | str) -> int:
        if isinstance(correlation_id, str):
            raise invalid(f"model '{self.name}' needs an integer correlation ID, got a string")
        return self._addable(correlation_id)


class StringDynaSequence(SequenceModel):
    """simple_string_dyna_sequence: a running sum; the END request adds the
    correlation id, a string that must read as an integer."""

    def check_correlation_id(self, correlation_id: int | str) -> int:
        try:
            number = int(correlation_id)
        except ValueError:
            raise invalid(f"model '{self.name}' needs a correlation ID that reads as an integer") from None
        return self._addable(number)

    def state_bytes(self, values: np.ndarray) -> int:
        return values.size * np.dtype(np.int64).itemsize  # the running sum, one int64 per row

    def step(self, state: np.ndarray | None, values: np.ndarray,
             start: bool) -> tuple[np.ndarray | None, np.ndarray]:
        total = values if state is None or state.shape != values.shape else state + values
        return total, total
