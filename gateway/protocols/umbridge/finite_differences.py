"""Derivatives of any model by central differences, from evaluations alone.

The caller supplies ``evaluate(rows)``, which returns the output vectors of
every row of input vectors (the gateway sends all rows of one derivative as
one batched V2 request when the model has a batch dimension). Steps are
relative, ``step * max(1, |x|)``, and the perturbed points are rounded to what
the model really receives (FP32 inputs cannot hold x + 1e-6), so the divisor
is the step actually taken.

Costs per call, with n the size of the input differentiated:
Gradient 2n rows (the whole Jacobian, then Jᵀ·sens), ApplyJacobian 2 rows
(one directional difference), ApplyHessian 4n rows (mixed differences of
sens·output along e_i and vec).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from gateway.core.errors import invalid
from gateway.core.types import Derivative

Rows = list[list[np.ndarray]]
Evaluate = Callable[[Rows], Awaitable[Rows]]
RoundTrip = Callable[[int, np.ndarray], np.ndarray]


def default_step(epsilon: float, hessian: bool) -> float:
    """The classic optimum: eps^(1/3) for first, eps^(1/4) for second differences."""
    return float(epsilon ** (0.25 if hessian else 1 / 3))


def _shifted(inputs: Sequence[np.ndarray], shifts: dict[int, np.ndarray], round_trip: RoundTrip) -> list[np.ndarray]:
    row = list(inputs)
    for index, delta in shifts.items():
        row[index] = round_trip(index, row[index] + delta)
    return row


def _scale(x: np.ndarray) -> float:
    return float(max(1.0, np.abs(x).max())) if x.size else 1.0


async def gradient(evaluate: Evaluate, round_trip: RoundTrip, inputs: Sequence[np.ndarray],
                   d: Derivative, step: float) -> np.ndarray:
    """Jᵀ·sens with J = ∂ output[out_wrt] / ∂ input[in_wrt]."""
    x = inputs[d.in_wrt]
    assert d.sens is not None
    if x.size == 0:
        return np.zeros(0)
    rows: Rows = []
    taken = np.empty(x.size)
    for j in range(x.size):
        e = np.zeros(x.size)
        e[j] = step * max(1.0, abs(x[j]))
        plus = _shifted(inputs, {d.in_wrt: e}, round_trip)
        minus = _shifted(inputs, {d.in_wrt: -e}, round_trip)
        taken[j] = plus[d.in_wrt][j] - minus[d.in_wrt][j]
        rows += [plus, minus]
    if not taken.all():
        raise invalid(f"the finite-difference step {step:g} vanishes in the input's datatype at this point; "
                      "configure a larger options.umbridge.finite_differences.step")
    outputs = await evaluate(rows)
    jacobian = np.stack([(outputs[2 * j][d.out_wrt] - outputs[2 * j + 1][d.out_wrt]) / taken[j]
                         for j in range(x.size)], axis=1)
    return jacobian.T @ d.sens


async def apply_jacobian(evaluate: Evaluate, round_trip: RoundTrip, inputs: Sequence[np.ndarray],
                         d: Derivative, step: float) -> np.ndarray:
    """J·vec as one directional central difference."""
    x, v = inputs[d.in_wrt], d.vec
    assert v is not None
    norm = float(np.abs(v).max()) if v.size else 0.0
    if norm == 0.0:
        outputs = await evaluate([list(inputs)])
        return np.zeros_like(outputs[0][d.out_wrt])
    t = step * _scale(x) / norm
    plus, minus = await evaluate([_shifted(inputs, {d.in_wrt: t * v}, round_trip),
                                  _shifted(inputs, {d.in_wrt: -t * v}, round_trip)])
    return (plus[d.out_wrt] - minus[d.out_wrt]) / (2 * t)


async def apply_hessian(evaluate: Evaluate, round_trip: RoundTrip, inputs: Sequence[np.ndarray],
                        d: Derivative, step: float) -> np.ndarray:
    """(Σₖ sensₖ ∂²outₖ / ∂in_wrt ∂in_wrt2)·vec by mixed central differences:
    for each i, [g(++) - g(+-) - g(-+) + g(--)] / 4ht with g = sens·output,
    the first sign along e_i of input in_wrt, the second along vec of in_wrt2."""
    x, v = inputs[d.in_wrt], d.vec
    assert v is not None and d.sens is not None
    norm = float(np.abs(v).max()) if v.size else 0.0
    if x.size == 0 or norm == 0.0:
        return np.zeros(x.size)
    t = step * _scale(inputs[d.in_wrt2]) / norm
    rows: Rows = []
    h = np.empty(x.size)
    for i in range(x.size):
        e = np.zeros(x.size)
        h[i] = step * max(1.0, abs(x[i]))
        e[i] = h[i]
        for sign_e in (1.0, -1.0):
            for sign_v in (1.0, -1.0):
                if d.in_wrt == d.in_wrt2:
                    rows.append(_shifted(inputs, {d.in_wrt: sign_e * e + sign_v * t * v}, round_trip))
                else:
                    rows.append(_shifted(inputs, {d.in_wrt: sign_e * e, d.in_wrt2: sign_v * t * v}, round_trip))
    outputs = await evaluate(rows)
    g = np.array([float(d.sens @ row[d.out_wrt]) for row in outputs]).reshape(x.size, 4)
    return (g[:, 0] - g[:, 1] - g[:, 2] + g[:, 3]) / (4 * h * t)


async def derivative(evaluate: Evaluate, round_trip: RoundTrip, inputs: Sequence[np.ndarray],
                     d: Derivative, step: float) -> np.ndarray:
    compute = {"Gradient": gradient, "ApplyJacobian": apply_jacobian, "ApplyHessian": apply_hessian}[d.kind]
    return await compute(evaluate, round_trip, inputs, d, step)
