"""The embedded demo models.

Each model declares V2 metadata and computes outputs from validated inputs
with numpy. ``simple`` and ``simple_string`` mirror Triton's classic example
models so Triton's public example clients work against the gateway unchanged.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import numpy as np

from gateway.core.errors import invalid, unsupported
from gateway.core.types import (
    CONFIG_PARAMETER,
    SUPPORT_PARAMETER,
    Derivative,
    InferRequest,
    ModelMetadata,
    Tensor,
    TensorSpec,
    config_from_text,
)

MODEL_VERSION = "1"
PLATFORM = "gateway_builtin"


class BuiltinModel(abc.ABC):
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # When True, any datatype and rank is accepted for every input.
    any_datatype: bool = False
    # Inputs a request may leave out.
    optional_inputs: frozenset[str] = frozenset()

    def metadata(self) -> ModelMetadata:
        return ModelMetadata(self.name, (MODEL_VERSION,), PLATFORM, self.inputs, self.outputs)

    def check_inputs(self, inputs: list[Tensor]) -> dict[str, Tensor]:
        by_name: dict[str, Tensor] = {}
        for tensor in inputs:
            if tensor.name in by_name:
                raise invalid(f"input '{tensor.name}' is given twice")
            by_name[tensor.name] = tensor
        expected = {spec.name: spec for spec in self.inputs}
        for name in by_name:
            if name not in expected:
                raise invalid(f"unexpected inference input '{name}' for model '{self.name}'; "
                              f"expected {', '.join(expected)}")
        for spec in self.inputs:
            found = by_name.get(spec.name)
            if found is None:
                if spec.name in self.optional_inputs:
                    continue
                raise invalid(f"model '{self.name}' expects {len(self.inputs)} inputs, "
                              f"input '{spec.name}' is missing")
            if self.any_datatype:
                continue
            if found.datatype != spec.datatype:
                raise invalid(f"input '{spec.name}' of model '{self.name}' must be {spec.datatype}, "
                              f"got {found.datatype}")
            if not _shape_fits(found.shape, spec.shape):
                raise invalid(f"input '{spec.name}' of model '{self.name}' must have shape "
                              f"{list(spec.shape)}, got {list(found.shape)}")
        return by_name

    def check_request(self, request: InferRequest) -> None:
        """What :meth:`infer` checks first, without computing: the declared
        inputs (names, datatypes, shapes), values unread."""
        self.check_inputs(request.inputs)

    @abc.abstractmethod
    def compute(self, inputs: dict[str, Tensor]) -> list[Tensor]: ...

    def infer(self, request: InferRequest) -> list[Tensor]:
        """Outputs for a request; models that need the whole request override it."""
        return self.run(self.check_inputs(request.inputs), request.parameters)

    def run(self, inputs: dict[str, Tensor], parameters: Mapping[str, Any]) -> list[Tensor]:
        """compute() for models that read request parameters too."""
        return self.compute(inputs)

    def derivative(self, inputs: dict[str, Tensor], parameters: Mapping[str, Any], d: Derivative) -> np.ndarray:
        raise unsupported(f"model '{self.name}' offers no derivatives")


def _shape_fits(shape: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    return len(shape) == len(declared) and all(d == -1 or d == s for s, d in zip(shape, declared, strict=True))


class AddSub(BuiltinModel):
    """INPUT0, INPUT1 [-1, 16] -> OUTPUT0 = sum, OUTPUT1 = difference."""

    def __init__(self, name: str, datatype: str) -> None:
        self.name = name
        self.inputs = tuple(TensorSpec(f"INPUT{i}", datatype, (-1, 16)) for i in range(2))
        self.outputs = tuple(TensorSpec(f"OUTPUT{i}", datatype, (-1, 16)) for i in range(2))
        self._strings = datatype == "BYTES"

    def compute(self, inputs: dict[str, Tensor]) -> list[Tensor]:
        a, b = inputs["INPUT0"].data, inputs["INPUT1"].data
        if a.shape != b.shape:
            raise invalid(f"INPUT0 and INPUT1 of '{self.name}' must have the same shape")
        if self._strings:
            a, b = _parse_integers(a, "INPUT0"), _parse_integers(b, "INPUT1")
            total, diff = _format_integers(a + b), _format_integers(a - b)
        else:
            total, diff = a + b, a - b
        return [Tensor.from_numpy("OUTPUT0", total, self.outputs[0].datatype),
                Tensor.from_numpy("OUTPUT1", diff, self.outputs[1].datatype)]


def _parse_integers(array: np.ndarray, name: str) -> np.ndarray:
    flat = array.reshape(-1)
    try:
        values = [int(item) for item in flat]
    except (ValueError, TypeError):
        raise invalid(f"{name} must hold decimal integers as strings") from None
    return np.array(values, dtype=np.int64).reshape(array.shape)


def _format_integers(array: np.ndarray) -> np.ndarray:
    out = np.empty(array.shape, dtype=object)
    out.reshape(-1)[:] = [str(v).encode() for v in array.reshape(-1).tolist()]
    return out


class Identity(BuiltinModel):
    """INPUT0 of any datatype and shape -> OUTPUT0, unchanged.

    Metadata cannot say "any datatype"; it advertises BYTES [-1] nominally
    and the parameter ``any_datatype`` tells clients the truth.
    """

    name = "identity"
    any_datatype = True
    inputs = (TensorSpec("INPUT0", "BYTES", (-1,), {"any_datatype": True}),)
    outputs = (TensorSpec("OUTPUT0", "BYTES", (-1,), {"any_datatype": True}),)

    def compute(self, inputs: dict[str, Tensor]) -> list[Tensor]:
        source = inputs["INPUT0"]
        return [Tensor("OUTPUT0", source.datatype, source.shape, source.data)]


class Forward(BuiltinModel):
    """The UM-Bridge demo: x = input_0 (2 values), y = input_1 (1 value) ->
    output_0 = scale·[x0 + x1, x0·y0, x1²], with ``scale`` from the UM-Bridge
    config (default 1). Offers every derivative, computed exactly."""

    name = "forward"
    inputs = (TensorSpec("input_0", "FP64", (2,)), TensorSpec("input_1", "FP64", (1,)))
    outputs = (TensorSpec("output_0", "FP64", (3,)),)
    _SLICES = (slice(0, 2), slice(2, 3))  # positions of input_0 and input_1 in z = [x0, x1, y0]

    def metadata(self) -> ModelMetadata:
        support = {SUPPORT_PARAMETER: "Evaluate,Gradient,ApplyJacobian,ApplyHessian"}
        return ModelMetadata(self.name, (MODEL_VERSION,), PLATFORM, self.inputs, self.outputs, support)

    @staticmethod
    def _scale(parameters: Mapping[str, Any]) -> float:
        scale = config_from_text(parameters.get(CONFIG_PARAMETER)).get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise invalid("config 'scale' of model 'forward' must be a number")
        return float(scale)

    def compute(self, inputs: dict[str, Tensor]) -> list[Tensor]:
        return self.run(inputs, {})

    def run(self, inputs: dict[str, Tensor], parameters: Mapping[str, Any]) -> list[Tensor]:
        x, y = inputs["input_0"].data, inputs["input_1"].data
        out = self._scale(parameters) * np.array([x[0] + x[1], x[0] * y[0], x[1] ** 2])
        return [Tensor.from_numpy("output_0", out, "FP64")]

    def derivative(self, inputs: dict[str, Tensor], parameters: Mapping[str, Any], d: Derivative) -> np.ndarray:
        x, y = inputs["input_0"].data, inputs["input_1"].data
        scale = self._scale(parameters)
        jacobians = (scale * np.array([[1.0, 1.0], [y[0], 0.0], [0.0, 2 * x[1]]]),
                     scale * np.array([[0.0], [x[0]], [0.0]]))
        if d.out_wrt != 0 or not (0 <= d.in_wrt < 2 and 0 <= d.in_wrt2 < 2):
            raise invalid("model 'forward' has inputs 0 and 1 and output 0")
        if d.kind == "Gradient" and d.sens is not None:
            return jacobians[d.in_wrt].T @ d.sens
        if d.kind == "ApplyJacobian" and d.vec is not None:
            return jacobians[d.in_wrt] @ d.vec
        if d.kind == "ApplyHessian" and d.sens is not None and d.vec is not None:
            second = np.zeros((3, 3, 3))  # ∂²output_k / ∂z_i ∂z_j
            second[1, 0, 2] = second[1, 2, 0] = 1.0
            second[2, 1, 1] = 2.0
            weighted = scale * np.tensordot(d.sens, second, axes=1)
            return weighted[self._SLICES[d.in_wrt], self._SLICES[d.in_wrt2]] @ d.vec
        raise invalid(f"{d.kind} of model 'forward' is missing sens or vec")


class Trig(BuiltinModel):
    """A batched FP32 model with known derivatives, for bridging tests:
    x [-1, 2], y [-1, 1] -> f [-1, 2] = [sin(x0)·y0, x0·x1²],
    g [-1, 1] = [exp(x1 / 2) + y0²], computed in float32."""

    name = "trig"
    inputs = (TensorSpec("x", "FP32", (-1, 2)), TensorSpec("y", "FP32", (-1, 1)))
    outputs = (TensorSpec("f", "FP32", (-1, 2)), TensorSpec("g", "FP32", (-1, 1)))

    def compute(self, inputs: dict[str, Tensor]) -> list[Tensor]:
        x, y = inputs["x"].data, inputs["y"].data
        if x.shape[0] != y.shape[0]:
            raise invalid(f"x and y of model 'trig' must have the same batch size, got {x.shape[0]} and {y.shape[0]}")
        x0, x1, y0 = x[:, 0], x[:, 1], y[:, 0]
        f = np.stack([np.sin(x0) * y0, x0 * x1 * x1], axis=1)
        g = (np.exp(x1 / np.float32(2)) + y0 * y0).reshape(-1, 1)
        return [Tensor.from_numpy("f", f, "FP32"), Tensor.from_numpy("g", g, "FP32")]

