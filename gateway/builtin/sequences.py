"""Stateful (sequence) demo models: Triton's sequence examples, embedded.

A sequence is the requests that share a correlation id (the request
parameter ``sequence_id``: a non-zero integer or a non-empty string),
opened by ``sequence_start`` and closed by ``sequence_end``. Each model keeps
its state per live sequence, in this process: state does not cross worker
processes or survive a reload (docs/protocols.md, "Sequences").

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
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.affinity import SEQUENCE_END, SEQUENCE_ID, SEQUENCE_START
from gateway.builtin.models import BuiltinModel
from gateway.errors import ErrorKind, GatewayError, invalid
from gateway.types import InferRequest, Tensor, TensorSpec

DEFAULT_IDLE_SECONDS = 60.0
DEFAULT_MAX_SEQUENCES = 1024
INT32_MIN, INT32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)


@dataclass(frozen=True, slots=True)
class SequenceSettings:
    idle_seconds: float = DEFAULT_IDLE_SECONDS  # a sequence idle this long is forgotten
    max_sequences: int = DEFAULT_MAX_SEQUENCES  # live sequences per model; past it new ones are refused


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


class SequenceModel(BuiltinModel):
    """INPUT INT32 [-1, 1] -> OUTPUT INT32 [-1, 1], with state per sequence.

    Subclasses say how a step changes the state and what it answers
    (:meth:`step`); this class keeps the sequences: START opens (or restarts)
    one, END closes it, a request of an unknown sequence without START is
    refused, and sequences idle past ``idle_seconds`` are forgotten.
    """

    inputs = (TensorSpec("INPUT", "INT32", (-1, 1)),)
    outputs = (TensorSpec("OUTPUT", "INT32", (-1, 1)),)

    def __init__(self, name: str, settings: SequenceSettings | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.settings = settings or SequenceSettings()
        self._clock = clock
        # correlation id -> (state, last use); ordered by last use, oldest first
        self._live: collections.OrderedDict[int | str, tuple[np.ndarray, float]] = collections.OrderedDict()

    def live_sequences(self) -> int:
        self._forget_idle(self._clock())
        return len(self._live)

    def compute(self, inputs: dict[str, Tensor]) -> list[Tensor]:
        raise invalid(f"model '{self.name}' is a sequence model: requests need a '{SEQUENCE_ID}' parameter")

    def infer(self, request: InferRequest) -> list[Tensor]:
        values = self.check_inputs(request.inputs)["INPUT"].data.astype(np.int64)
        controls = sequence_controls(request.parameters, self.name)
        correlation_id = self.check_correlation_id(controls.correlation_id)
        now = self._clock()
        self._forget_idle(now)
        known = self._live.pop(controls.correlation_id, None)
        if known is None and not controls.start:
            raise invalid(f"inference request for sequence {controls.correlation_id} to model '{self.name}' must "
                          "specify the START flag on the first request of the sequence")
        if known is None and len(self._live) >= self.settings.max_sequences:
            raise GatewayError(ErrorKind.OVERLOADED, f"model '{self.name}' holds {len(self._live)} live sequences, "
                               "its limit; end sequences or wait for idle ones to expire")
        state = None if controls.start or known is None else known[0]
        state, answer = self.step(state, values, controls.start)
        if controls.end:
            answer = answer + correlation_id
        else:
            self._live[controls.correlation_id] = (state, now)
        output = np.clip(answer, INT32_MIN, INT32_MAX).astype(np.int32)
        return [Tensor.from_numpy("OUTPUT", output, "INT32")]

    def check_correlation_id(self, correlation_id: int | str) -> int:
        """The id as the number added on END (0 where the model adds none)."""
        return 0

    def _addable(self, number: int) -> int:
        """The END request adds the id to an INT32 output: it must fit."""
        if not INT32_MIN <= number <= INT32_MAX:
            raise invalid(f"model '{self.name}' adds the correlation ID to its INT32 output; {number} does not fit")
        return number

    def step(self, state: np.ndarray | None, values: np.ndarray, start: bool) -> tuple[np.ndarray, np.ndarray]:
        """(the new state, the answer) for one request's INPUT."""
        return values, values + (1 if start else 0)

    def _forget_idle(self, now: float) -> None:
        horizon = now - self.settings.idle_seconds
        while self._live:
            oldest = next(iter(self._live))
            if self._live[oldest][1] > horizon:
                break
            del self._live[oldest]


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

    def step(self, state: np.ndarray | None, values: np.ndarray, start: bool) -> tuple[np.ndarray, np.ndarray]:
        total = values if state is None or state.shape != values.shape else state + values
        return total, total
