"""How a model looks to UM-Bridge clients, derived from its V2 metadata.

A UM-Bridge model takes and returns lists of float64 vectors. Each vector is
one tensor of the model: sized by the product of its dimensions, leaving out
the batch dimension (a leading -1 on every input and output), converted to the
tensor's datatype on the way in and back to float64 on the way out. Several
rows of vectors (finite-difference perturbations) become one batched request.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gateway.core.errors import ErrorKind, GatewayError, invalid, unsupported
from gateway.core.tensors import bf16_to_float, float_to_bf16
from gateway.core.types import (
    CONFIG_PARAMETER,
    DERIVATIVE_KINDS,
    NUMPY_DTYPES,
    SUPPORT_PARAMETER,
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestedOutput,
    Tensor,
    TensorSpec,
)
from gateway.protocols.umbridge.codec import FEATURES
from gateway.protocols.umbridge.options import FiniteDifferences, RouteOptions

FLOAT_TYPES = ("FP16", "FP32", "FP64", "BF16")
_NUMERIC = frozenset(NUMPY_DTYPES) - {"BYTES"}
_BF16_EPS = 2.0 ** -7


@dataclass(frozen=True, slots=True)
class Slot:
    """One UM-Bridge vector and the tensor behind it."""

    name: str
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension
    size: int


@dataclass(frozen=True, slots=True)
class ModelView:
    name: str
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    batched: bool
    support: frozenset[str]  # UM-Bridge features offered
    native: frozenset[str]  # derivative kinds the upstream answers itself (the rest: finite differences)
    finite_differences: FiniteDifferences | None
    # Upstream tensor index of each vector, for native derivatives (None: the
    # route maps only some tensors, so the upstream cannot be asked).
    input_positions: tuple[int, ...] | None = None
    output_positions: tuple[int, ...] | None = None

    @property
    def input_sizes(self) -> tuple[int, ...]:
        return tuple(s.size for s in self.inputs)

    @property
    def output_sizes(self) -> tuple[int, ...]:
        return tuple(s.size for s in self.outputs)

    @property
    def in_upstream_order(self) -> bool:
        """Whether the vectors are all of the model's tensors, in its order,
        the inputs FP64: then a UM-Bridge call and answer mean the same to
        a UM-Bridge upstream as to the client (the pass-through's test)."""
        return (self.input_positions == tuple(range(len(self.inputs)))
                and self.output_positions == tuple(range(len(self.outputs)))
                and all(slot.datatype == "FP64" for slot in self.inputs))

    def require(self, feature: str) -> None:
        if feature not in self.support:
            hint = (" (derivatives of V2 models need options.umbridge.finite_differences on the route)"
                    if feature in DERIVATIVE_KINDS and not self.native else "")
            raise unsupported(f"{feature} is not supported by model '{self.name}'{hint}")

    def request(self, rows: Sequence[Sequence[np.ndarray]], config_text: str, request_id: str = "") -> InferRequest:
        """One canonical request for ``rows`` of input vectors (one row unless batched)."""
        if not self.batched and len(rows) != 1:
            raise GatewayError(ErrorKind.INTERNAL, "several rows for a model without a batch dimension")
        tensors = []
        for index, slot in enumerate(self.inputs):
            values = np.stack([row[index] for row in rows]) if rows else np.zeros((0, slot.size))
            shape = (len(rows), *slot.dims) if self.batched else slot.dims
            tensors.append(Tensor.from_numpy(slot.name, to_datatype(values, slot, index).reshape(shape),
                                             slot.datatype))
        parameters = {CONFIG_PARAMETER: config_text} if config_text else {}
        return InferRequest(self.name, "", request_id, tensors, [RequestedOutput(s.name) for s in self.outputs],
                            parameters)

    def rows_of(self, response: InferResponse, count: int) -> list[list[np.ndarray]]:
        """The output vectors of each of ``count`` rows."""
        by_name = {t.name: t for t in response.outputs}
        columns = []
        for slot in self.outputs:
            tensor = by_name.get(slot.name)
            if tensor is None:
                raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"model '{self.name}' returned no '{slot.name}'")
            if tensor.element_count != count * slot.size:
                raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                                   f"output '{slot.name}' of model '{self.name}' has {tensor.element_count} "
                                   f"elements; {count} row(s) of size {slot.size} were expected")
            columns.append(to_float64(tensor).reshape(count, slot.size))
        return [[column[r] for column in columns] for r in range(count)]

    def round_trip(self, index: int, values: np.ndarray) -> np.ndarray:
        """``values`` as input ``index`` will really reach the model."""
        slot = self.inputs[index]
        if slot.datatype == "BF16":
            return bf16_to_float(float_to_bf16(values)).astype(np.float64)
        return values.astype(NUMPY_DTYPES[slot.datatype]).astype(np.float64)

    def epsilon(self, index: int) -> float:
        datatype = self.inputs[index].datatype
        return _BF16_EPS if datatype == "BF16" else float(np.finfo(NUMPY_DTYPES[datatype]).eps)


def to_datatype(values: np.ndarray, slot: Slot, index: int) -> np.ndarray:
    """float64 vectors as the tensor's datatype; values it cannot hold are errors."""
    datatype = slot.datatype
    if datatype == "FP64":
        return values
    where = f"input {index} (tensor '{slot.name}', {datatype})"
    if datatype == "BF16":
        return float_to_bf16(values)
    dtype = NUMPY_DTYPES[datatype]
    if datatype in FLOAT_TYPES:
        with np.errstate(over="ignore"):
            cast = values.astype(dtype)
        if (np.isfinite(values) & ~np.isfinite(cast)).any():
            raise invalid(f"{where} holds a value too large for {datatype}")
        return cast
    if not np.isfinite(values).all() or (values != np.round(values)).any():
        raise invalid(f"{where} takes integers; got a value with a fraction, NaN or infinity")
    if datatype == "BOOL":
        if not np.isin(values, (0.0, 1.0)).all():
            raise invalid(f"{where} takes 0 or 1")
        return values.astype(np.bool_)
    limits = np.iinfo(dtype)
    if values.size and (values.min() < limits.min or values.max() > limits.max):
        raise invalid(f"{where} holds a value out of range for {datatype}")
    return values.astype(dtype)


def to_float64(tensor: Tensor) -> np.ndarray:
    if tensor.datatype == "BF16":
        return bf16_to_float(tensor.data.reshape(-1)).astype(np.float64)
    if tensor.datatype not in _NUMERIC:
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"output '{tensor.name}' is {tensor.datatype}, "
                           "not a number type")
    return np.asarray(tensor.data, dtype=np.float64).reshape(-1)


def _pick(specs: tuple[TensorSpec, ...], names: tuple[str, ...] | None, what: str, model: str) -> list[TensorSpec]:
    if names is None:
        return list(specs)
    by_name = {s.name: s for s in specs}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise unsupported(f"route option umbridge.{what}s names {', '.join(missing)}, which model '{model}' "
                          f"does not have; its {what}s: {', '.join(by_name) or 'none'}")
    return [by_name[n] for n in names]


def _slot(spec: TensorSpec, batched: bool, model: str, what: str) -> Slot:
    problem = ""
    dims = spec.shape[1:] if batched else spec.shape
    if spec.datatype not in _NUMERIC:
        problem = f"is {spec.datatype}, not a number type"
    elif any(d < 0 for d in dims):
        problem = f"has a variable dimension in shape {list(spec.shape)}"
    if problem:
        raise unsupported(f"model '{model}' cannot be used over UM-Bridge: {what} '{spec.name}' {problem}")
    return Slot(spec.name, spec.datatype, tuple(dims), math.prod(dims))


def _declared_support(metadata: ModelMetadata) -> frozenset[str] | None:
    declared = metadata.parameters.get(SUPPORT_PARAMETER)
    if not isinstance(declared, str):
        return None
    return frozenset(f.strip() for f in declared.split(",")) & frozenset(FEATURES)


def build_view(name: str, metadata: ModelMetadata, options: RouteOptions | None,
               native_derivatives: bool = True) -> ModelView:
    """The UM-Bridge view of a model, or UNSUPPORTED when it has none.

    ``native_derivatives``: whether the route's upstream can be asked for
    derivatives itself. Metadata that crossed a V2 hop (another gateway's
    view of a UM-Bridge model) may declare derivatives no V2 request can
    carry; without this they are dropped (finite differences may stand in).
    """
    options = options or RouteOptions()
    inputs = _pick(metadata.inputs, options.inputs, "input", name)
    outputs = _pick(metadata.outputs, options.outputs, "output", name)
    if not outputs:
        raise unsupported(f"model '{name}' cannot be used over UM-Bridge: it declares no outputs")
    specs = inputs + outputs
    batched = all(s.shape and s.shape[0] == -1 for s in specs)
    in_slots = tuple(_slot(s, batched, name, "input") for s in inputs)
    out_slots = tuple(_slot(s, batched, name, "output") for s in outputs)
    declared = _declared_support(metadata)
    support = declared if declared is not None else frozenset({"Evaluate"})
    in_positions = _positions(metadata.inputs, inputs)
    out_positions = _positions(metadata.outputs, outputs)
    native = support & frozenset(DERIVATIVE_KINDS)
    if not native_derivatives or in_positions is None or out_positions is None:
        support, native = support - native, frozenset()
    fd = options.finite_differences
    if fd is not None and "Evaluate" in support and all(s.datatype in FLOAT_TYPES for s in in_slots):
        support |= frozenset(DERIVATIVE_KINDS)
    else:
        fd = None
    return ModelView(name, in_slots, out_slots, batched, support, native, fd, in_positions, out_positions)


def _positions(specs: tuple[TensorSpec, ...], picked: list[TensorSpec]) -> tuple[int, ...] | None:
    """Each picked tensor's index in ``specs``; None unless all are picked."""
    if len(picked) != len(specs):
        return None
    return tuple(specs.index(s) for s in picked)


def umbridge_metadata(name: str, input_sizes: Sequence[int], output_sizes: Sequence[int],
                      support: frozenset[str], platform: str) -> ModelMetadata:
    """V2 metadata of a UM-Bridge model: one FP64 vector tensor per input/output."""
    return ModelMetadata(
        name, (), platform,
        tuple(TensorSpec(f"input_{i}", "FP64", (n,)) for i, n in enumerate(input_sizes)),
        tuple(TensorSpec(f"output_{i}", "FP64", (n,)) for i, n in enumerate(output_sizes)),
        {SUPPORT_PARAMETER: ",".join(f for f in FEATURES if f in support)})
