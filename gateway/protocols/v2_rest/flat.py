"""Triton's flat generate object, both ways (docs/protocols.md, "generate /
generate_stream"): a tensor as one field (a scalar when it holds one
element, else a flat row-major list), its datatype and shape read back from
the model's V2 metadata. Pure functions, shared by the listener
(generate.py) and the V2 REST upstream's ``streaming: generate_stream``."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import orjson

from gateway.core.errors import GatewayError, invalid
from gateway.core.tensors import array_to_json
from gateway.core.types import DATATYPES, Tensor, TensorSpec

PARAMETERS_FIELD = "parameters"
# Seconds a model's V2 metadata (its tensors' names, datatypes, shapes) is reused.
METADATA_TTL = 10.0


def json_shape(value: Any, where: str) -> list[int]:
    """The shape of a scalar ([1]) or of a rectangular nested list."""
    if not isinstance(value, list):
        return [1]
    shape: list[int] = []
    probe: Any = value
    while isinstance(probe, list):
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    level: list[Any] = [value]
    for size in shape:
        below: list[Any] = []
        for item in level:
            if not isinstance(item, list) or len(item) != size:
                raise invalid(f"{where}: a ragged list (each level must hold lists of one length)")
            below.extend(item)
        level = below
    if any(isinstance(item, list) for item in level):
        raise invalid(f"{where}: a ragged list (each level must hold lists of one length)")
    return shape


def fit_shape(own: list[int], declared: tuple[int, ...]) -> list[int]:
    """The model's declared shape when the data fills it (its one variable
    dimension resolved: 16 values for a [1, 16] input), else the data's own
    (the upstream judges it)."""
    if len(declared) == len(own) and all(d in (-1, o) for d, o in zip(declared, own, strict=True)):
        return own
    count = math.prod(own)
    known = math.prod(d for d in declared if d >= 0)
    free = sum(1 for d in declared if d < 0)
    if free == 0 and known == count and declared:
        return list(declared)
    if free == 1 and known > 0 and count % known == 0:
        return [count // known if d < 0 else d for d in declared]
    return own


def _leaf(value: Any) -> Any:
    while isinstance(value, list) and value:
        value = value[0]
    return value


def declares_datatype(spec: TensorSpec) -> bool:
    """Whether the model's metadata gives a datatype the gateway knows and
    does not say it takes any (the builtin ``identity``)."""
    return spec.datatype in DATATYPES and not spec.parameters.get("any_datatype")


def field_datatype(spec: TensorSpec, value: Any) -> str:
    """The declared datatype, else one read from the JSON's first value."""
    if declares_datatype(spec):
        return spec.datatype
    leaf = _leaf(value)
    if isinstance(leaf, str):
        return "BYTES"
    if isinstance(leaf, bool):
        return "BOOL"
    return "INT64" if isinstance(leaf, int) else "FP64"


def tensor_item(spec: TensorSpec, value: Any, where: str) -> dict[str, Any]:
    """A field's value as a V2 JSON tensor object (for codec.decode_tensors)."""
    shape = fit_shape(json_shape(value, where), spec.shape)
    return {"name": spec.name, "datatype": field_datatype(spec, value), "shape": shape,
            "data": value if isinstance(value, list) else [value]}


def tensor_fields(tensors: Iterable[Tensor], where: str) -> dict[str, Any]:
    """Each tensor as a field: a scalar when it holds one element, else a
    flat list. ``where``: "input" or "output", for the error."""
    fields: dict[str, Any] = {}
    for tensor in tensors:
        try:
            data = array_to_json(tensor)
        except GatewayError:
            raise invalid(f"{where} '{tensor.name}' holds non-UTF-8 bytes that JSON cannot carry") from None
        if tensor.data.size == 1:
            item = data[0]
            fields[tensor.name] = item.item() if hasattr(item, "item") else item
        else:
            fields[tensor.name] = data
    return fields


# --- the upstream side: an infer request out, flat answers back ----------------

# Fields of an answer that are not outputs.
_ANSWER_FIELDS = ("model_name", "model_version", "id", PARAMETERS_FIELD)


def encode_flat_request(inputs: Iterable[Tensor], parameters: dict[str, Any]) -> bytes:
    """An infer request as Triton's flat generate object: each input a field,
    the request parameters under ``parameters`` (never confused with an
    input of the same name)."""
    obj = tensor_fields(inputs, "input")
    if parameters:
        obj[PARAMETERS_FIELD] = dict(parameters)
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def flat_answer_items(obj: dict[str, Any], outputs: tuple[TensorSpec, ...]) -> list[dict[str, Any]]:
    """A flat answer's outputs as V2 JSON tensor objects, by the model's
    declared outputs; a model that declares none gets each other field
    as an output, its datatype read from the JSON."""
    if outputs:
        return [tensor_item(spec, obj[spec.name], f"output '{spec.name}'") for spec in outputs if spec.name in obj]
    return [tensor_item(TensorSpec(name, "", ()), value, f"output '{name}'")
            for name, value in obj.items() if name not in _ANSWER_FIELDS]
