"""The embedded demo models.

Each model declares V2 metadata and computes outputs from validated inputs
with numpy. ``simple`` and ``simple_string`` mirror Triton's classic example
models so Triton's public example clients work against the gateway unchanged.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from gateway.errors import invalid
from gateway.types import InferRequest, ModelMetadata, Tensor, TensorSpec

if TYPE_CHECKING:
    from gateway.builtin.gnn import GnnSettings

MODEL_VERSION = "1"
PLATFORM = "gateway_builtin"


class BuiltinModel(abc.ABC):
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # When True, any datatype and rank is accepted for every input.
    any_datatype: bool = False

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

    @abc.abstractmethod
    def compute(self, inputs: dict[str, Tensor]) -> list[Tensor]: ...

    def infer(self, request: InferRequest) -> list[Tensor]:
        """Outputs for a request; models that read request parameters override it."""
        return self.compute(self.check_inputs(request.inputs))


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


def default_models(gnn: GnnSettings | None = None) -> dict[str, BuiltinModel]:
    from gateway.builtin.gnn import GnnModel, GnnSettings

    factories: list[Callable[[], BuiltinModel]] = [
        lambda: AddSub("simple", "INT32"),
        lambda: AddSub("simple_string", "BYTES"),
        Identity,
        lambda: GnnModel(gnn or GnnSettings()),
    ]
    models = [make() for make in factories]
    return {model.name: model for model in models}
