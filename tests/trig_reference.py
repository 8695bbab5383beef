"""The ``trig`` model's formulas and analytic derivatives, and a check of
what a UM-Bridge client sees of it, for every test that compares the
gateway's finite differences with them: in process (builtin model), over
UM-Bridge to the builtin model, and over V2 to the same model on MLServer.

trig: x [2], y [1] -> f = [sin(x0)·y0, x0·x1²], g = [exp(x1/2) + y0²], FP32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

INPUT_SIZES = (2, 1)
OUTPUT_SIZES = (2, 1)
TRIG_SLICES = (slice(0, 2), slice(2, 3))  # x and y within z = [x0, x1, y0]
POINTS = [(np.array([0.3, -1.2]), np.array([2.0])), (np.array([1.7, 0.4]), np.array([-0.5]))]

# What central differences of an FP32 model reach with the default steps
# (docs/umbridge.md: about 3 significant digits).
FIRST_TOLERANCE = 2e-3
HESSIAN_TOLERANCE = 3e-2
VALUE_TOLERANCE = 1e-6  # FP32 evaluation


def trig_values(x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    x0, x1, y0 = x[0], x[1], y[0]
    return [np.array([np.sin(x0) * y0, x0 * x1 * x1]), np.array([np.exp(x1 / 2) + y0 * y0])]


def trig_jacobians(x: np.ndarray, y: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    """(output, input) -> Jacobian of trig."""
    x0, x1, y0 = x[0], x[1], y[0]
    return {(0, 0): np.array([[np.cos(x0) * y0, 0.0], [x1 * x1, 2 * x0 * x1]]),
            (0, 1): np.array([[np.sin(x0)], [0.0]]),
            (1, 0): np.array([[0.0, 0.5 * np.exp(x1 / 2)]]),
            (1, 1): np.array([[2 * y0]])}


def trig_second(x: np.ndarray, y: np.ndarray) -> list[list[np.ndarray]]:
    """Per output, per component: the 3x3 second derivatives by z = [x0, x1, y0]."""
    x0, x1, y0 = x[0], x[1], y[0]
    f0 = np.array([[-np.sin(x0) * y0, 0, np.cos(x0)], [0, 0, 0], [np.cos(x0), 0, 0]])
    f1 = np.array([[0, 2 * x1, 0], [2 * x1, 2 * x0, 0], [0, 0, 0]])
    g0 = np.array([[0, 0, 0], [0, 0.25 * np.exp(x1 / 2), 0], [0, 0, 2]])
    return [[f0, f1], [g0]]


def hessian_action(second: list[np.ndarray], sens: np.ndarray, in1: int, in2: int, vec: np.ndarray,
                   slices: tuple[slice, ...]) -> np.ndarray:
    weighted = sum(s * h for s, h in zip(sens, second, strict=True))
    return np.asarray(weighted)[slices[in1], slices[in2]] @ vec


def check_httpmodel(model: Any, x: np.ndarray, y: np.ndarray, inputs: Sequence[int] = (0, 1),
                    outputs: Sequence[int] = (0, 1), upstream_rows: Callable[[], list[int]] | None = None) -> None:
    """Sizes, Evaluate and every Gradient, ApplyJacobian and ApplyHessian of
    ``model`` (a ``umbridge.HTTPModel`` of trig whose UM-Bridge input i is
    trig's input ``inputs[i]`` and output k trig's output ``outputs[k]``)
    against the analytic values at (x, y).

    ``upstream_rows()``, when given, returns the batch size of every request
    the model's server received since it was last called: each UM-Bridge call
    must have reached it as ONE batched request of all its rows.
    """
    point = [x, y]
    sizes = [INPUT_SIZES[i] for i in inputs]
    assert model.get_input_sizes() == sizes
    assert model.get_output_sizes() == [OUTPUT_SIZES[k] for k in outputs]
    assert model.supports_evaluate() and model.supports_gradient()
    assert model.supports_apply_jacobian() and model.supports_apply_hessian()
    arguments = [point[i].tolist() for i in inputs]

    def arrived(rows: int, call: str) -> None:
        if upstream_rows is not None:
            assert upstream_rows() == [rows], f"{call}: expected one request of {rows} rows"

    if upstream_rows is not None:
        upstream_rows()  # forget the calls made before this check
    values = trig_values(x, y)
    for got, k in zip(model(arguments), outputs, strict=True):
        np.testing.assert_allclose(got, values[k], rtol=VALUE_TOLERANCE)
    arrived(1, "Evaluate")
    jacobians = trig_jacobians(x, y)
    second = trig_second(x, y)
    rng = np.random.default_rng(5)
    for out_wrt, k in enumerate(outputs):
        for in_wrt, i in enumerate(inputs):
            jacobian = jacobians[(k, i)]
            sens = rng.normal(size=jacobian.shape[0])
            grad = model.gradient(out_wrt, in_wrt, arguments, sens.tolist())
            np.testing.assert_allclose(grad, jacobian.T @ sens, rtol=FIRST_TOLERANCE, atol=FIRST_TOLERANCE)
            arrived(2 * sizes[in_wrt], f"Gradient({out_wrt}, {in_wrt})")
            vec = rng.normal(size=jacobian.shape[1])
            jv = model.apply_jacobian(out_wrt, in_wrt, arguments, vec.tolist())
            np.testing.assert_allclose(jv, jacobian @ vec, rtol=FIRST_TOLERANCE, atol=FIRST_TOLERANCE)
            arrived(2, f"ApplyJacobian({out_wrt}, {in_wrt})")
            for in_wrt2, i2 in enumerate(inputs):
                vec2 = rng.normal(size=sizes[in_wrt2])
                hv = model.apply_hessian(out_wrt, in_wrt, in_wrt2, arguments, sens.tolist(), vec2.tolist())
                expected = hessian_action(second[k], sens, i, i2, vec2, TRIG_SLICES)
                np.testing.assert_allclose(hv, expected, rtol=HESSIAN_TOLERANCE, atol=HESSIAN_TOLERANCE)
                arrived(4 * sizes[in_wrt], f"ApplyHessian({out_wrt}, {in_wrt}, {in_wrt2})")
