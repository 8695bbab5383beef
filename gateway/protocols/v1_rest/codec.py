"""V1 REST JSON (TensorFlow Serving's REST predict API, KServe's V1
protocol) <-> canonical tensors; the mapping is in docs/protocols.md.

A request holds ``instances`` (rows: one entry per example, stacked along a
new first dimension) or ``inputs`` (columnar: each input's whole batch).
Either names its inputs (objects ``{input: value}``) or gives one unnamed
input. Values are numbers, booleans, strings or ``{"b64": "..."}`` (BYTES),
nested in regular lists. Input names and datatypes come from the model's V2
metadata when it has some, else from the values (:data:`DEFAULT_DATATYPES`).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from gateway.core.errors import ErrorKind, GatewayError, invalid, malformed
from gateway.core.limits import BYTES_ELEMENT_COST, TensorAllowance
from gateway.core.tensors import (
    FAST_JSON_MIN_BYTES,
    JsonNumbers,
    array_from_json,
    bf16_to_float,
    is_json_array,
    is_json_object,
    json_fields,
    json_numbers,
    plain,
    read_json_fast,
    written_as_integers,
)
from gateway.core.types import MAX_DIMS, Tensor, TensorSpec, element_count
from gateway.protocols.v1_rest.errors import STATUS_OF_KIND

PROTOCOL = "v1-rest"
JSON_TYPE = "application/json"

# The name of the one unnamed input when the model's metadata names none.
DEFAULT_INPUT = "instances"
# A value's datatype when the model's metadata does not say (JSON leaf types).
DEFAULT_DATATYPES = {"bool": "BOOL", "int": "INT64", "float": "FP32", "str": "BYTES"}
# A model input that takes any datatype (the builtin identity model): the values' own.
ANY_DATATYPE = "any_datatype"
_NUMBERS = frozenset({int, float})


@dataclass(slots=True)
class Predict:
    """A decoded ``:predict`` body."""

    inputs: list[Tensor]
    parameters: dict[str, Any] = field(default_factory=dict)
    rows: int | None = None  # instances in a row request; None: columnar


class NotTensors(GatewayError):
    """A request body that is a JSON object but no tensors the listener can
    make (ragged instances, a custom model's own fields). V1 servers take
    such bodies (a KServe custom model gets the object as it is), so toward
    one it goes up unchanged; toward any other upstream it is refused."""


# --- requests -----------------------------------------------------------------


def decode_predict(body: bytes | bytearray, specs: tuple[TensorSpec, ...], allowance: TensorAllowance,
                   fast_min_bytes: int = FAST_JSON_MIN_BYTES) -> Predict:
    """A ``:predict`` body as tensors; ``specs`` are the model's inputs from
    its V2 metadata (empty: unknown). Raises MALFORMED/INVALID/TOO_LARGE.
    Bodies from ``fast_min_bytes`` on have their numeric lists read straight
    into numpy when the fast reader can vouch for them (gateway/core/tensors.py)."""
    payload = None
    if len(body) >= fast_min_bytes:
        payload = read_json_fast(body, lambda root: _fast_payload(root, specs), allowance.charge)
    if payload is None:
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise malformed("the request body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise malformed("the request body must be a JSON object holding 'instances' or 'inputs'")
    try:
        return _predict(payload, specs, allowance, body)
    except GatewayError as error:
        if error.kind in (ErrorKind.INVALID_INPUT, ErrorKind.MALFORMED_REQUEST):
            raise NotTensors(error.kind, error.message) from None
        raise


def _predict(payload: dict[str, Any], specs: tuple[TensorSpec, ...], allowance: TensorAllowance,
             body: bytes | bytearray) -> Predict:
    if ("instances" in payload) == ("inputs" in payload):
        raise malformed("the request must hold exactly one of 'instances' (row format) or 'inputs' (columnar "
                        "format)")
    parameters = _parameters(payload.get("parameters"))
    if "instances" in payload:
        instances = payload["instances"]
        named = _rows(instances)
        rows = instances.shape[0] if isinstance(instances, JsonNumbers) else len(instances)
    else:
        named, rows = _columns(payload["inputs"]), None
    by_name = {spec.name: spec for spec in specs}
    inputs = []
    for name, value in named:
        spec = _spec(name, specs, by_name)
        inputs.append(_tensor(spec.name if spec is not None else name or DEFAULT_INPUT, value, spec, allowance, body))
    return Predict(inputs, parameters, rows)


def _fast_payload(root: Any, specs: tuple[TensorSpec, ...]) -> dict[str, Any]:
    """The parsed body as Python values, numeric lists of unnamed inputs
    and of columnar named ones as :class:`JsonNumbers`."""
    payload = json_fields(root)
    by_name = {spec.name: spec for spec in specs}
    for key, value in payload.items():
        if key in ("instances", "inputs") and is_json_array(value):
            payload[key] = _fast_numbers(value, specs[0] if len(specs) == 1 else None)
        elif key == "inputs" and is_json_object(value):
            fields = json_fields(value)
            payload[key] = {name: _fast_numbers(item, by_name.get(name)) if is_json_array(item) else plain(item)
                            for name, item in fields.items()}
        else:
            payload[key] = plain(value)
    return payload


def _fast_numbers(value: Any, spec: TensorSpec | None) -> Any:
    """A JSON list as :class:`JsonNumbers` read for the input's datatype
    (without one: integers, else floats), or as plain values."""
    if spec is not None and not spec.parameters.get(ANY_DATATYPE):
        numbers = json_numbers(value, spec.datatype)
    else:
        numbers = json_numbers(value, "INT64") or json_numbers(value, "FP32")
    return numbers if numbers is not None else plain(value)


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def _is_named(value: Any) -> bool:
    return isinstance(value, dict) and not _is_b64(value)


def _parameters(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise malformed("'parameters' must be a JSON object")
    for key, item in value.items():
        if isinstance(item, (list, dict)) or item is None:
            raise invalid(f"parameter {key[:100]!r} must be a string, number or boolean")
    return value


def _rows(instances: Any) -> list[tuple[str | None, Any]]:
    """(input name or None, the input's values stacked) of a row request."""
    if isinstance(instances, JsonNumbers) and instances.shape[0]:
        return [(None, instances)]
    if not isinstance(instances, list) or not instances:
        raise malformed("'instances' must be a non-empty list (one entry per instance)")
    named = [_is_named(instance) for instance in instances]
    if not any(named):
        return [(None, instances)]
    if not all(named):
        raise invalid("'instances' mixes objects {input: value} with plain values")
    names = list(instances[0])
    if not names:
        raise invalid("instance 0 is an empty object: name at least one input")
    keys = set(names)
    for i, instance in enumerate(instances):
        if instance.keys() != keys:
            raise invalid(f"instance {i} names inputs {sorted(instance)[:20]}, instance 0 names "
                          f"{sorted(keys)[:20]}: every instance must name the same inputs")
    return [(name, [instance[name] for instance in instances]) for name in names]


def _columns(inputs: Any) -> list[tuple[str | None, Any]]:
    if not _is_named(inputs):
        return [(None, inputs)]
    if not inputs:
        raise invalid("'inputs' is an empty object: name at least one input")
    return list(inputs.items())


def _spec(name: str | None, specs: tuple[TensorSpec, ...], by_name: dict[str, TensorSpec]) -> TensorSpec | None:
    if not specs:
        return None
    if name is None:
        if len(specs) != 1:
            shown = ", ".join(spec.name for spec in specs[:20])
            raise invalid(f"the model takes {len(specs)} inputs ({shown}): name them, as instances "
                          "{input: value} or as 'inputs': {input: values}")
        return specs[0]
    spec = by_name.get(name)
    if spec is None:
        shown = ", ".join(s.name for s in specs[:20])
        raise invalid(f"the model has no input {name[:100]!r}; its inputs are {shown}")
    return spec


def _shape_and_leaves(value: Any, where: str, max_elements: int) -> tuple[list[int], list[Any]]:
    """The shape of nested lists (their first entries say it) and their
    leaves in row-major order; INVALID when they are ragged."""
    shape: list[int] = []
    probe = value
    while isinstance(probe, list):
        if len(shape) == MAX_DIMS:
            raise invalid(f"{where}: nested more than {MAX_DIMS} lists deep")
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    element_count(shape, where, max_elements)  # bounded before the leaves are gathered
    rank = len(shape)
    if rank == 0:
        return shape, [value]
    leaves: list[Any] = []
    stack = [(value, 0)]
    while stack:
        items, depth = stack.pop()
        if len(items) != shape[depth]:
            raise invalid(f"{where}: ragged values: a list of {len(items)} where {shape[depth]} are expected "
                          f"(dimension {depth}); every instance must have the same shape")
        if depth + 1 == rank:
            if any(isinstance(item, list) for item in items):
                raise invalid(f"{where}: ragged values: a list where a value is expected (dimension {rank})")
            leaves.extend(items)
            continue
        for item in reversed(items):
            if not isinstance(item, list):
                raise invalid(f"{where}: ragged values: a value where a list is expected (dimension {depth + 1})")
            stack.append((item, depth + 1))
    return shape, leaves


def _datatype_of_values(leaves: list[Any], where: str, body: bytes | bytearray, allowance: TensorAllowance) -> str:
    """The default datatype of JSON leaves (:data:`DEFAULT_DATATYPES`):
    integer literals are INT64 however large (beyond it: out of range)."""
    types = {type(leaf) for leaf in leaves}
    if not types:
        return "FP32"
    if types <= {str, dict}:
        return "BYTES"
    if types == {bool}:
        return "BOOL"
    if types == {int}:
        return "INT64"
    if types <= _NUMBERS:
        return "INT64" if written_as_integers(leaves, body, allowance.charge) else "FP32"
    shown = sorted(t.__name__ for t in types)
    raise invalid(f"{where}: values must be all numbers, all booleans or all strings/b64 objects; got {shown}")


def _element_bytes(leaf: Any, where: str) -> bytes:
    if isinstance(leaf, str):
        try:
            return leaf.encode()
        except UnicodeEncodeError:
            raise invalid(f"{where}: a string holds a lone surrogate") from None
    if _is_b64(leaf) and isinstance(leaf["b64"], str):
        try:
            return base64.b64decode(leaf["b64"], validate=True)
        except (binascii.Error, ValueError):
            raise invalid(f"{where}: a 'b64' value is not valid base64") from None
    raise invalid(f"{where}: BYTES values must be strings or {{\"b64\": \"...\"}} objects")


def _fits(shape: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    return len(declared) == len(shape) and all(d in (-1, s) for d, s in zip(declared, shape, strict=True))


def _fitted(shape: tuple[int, ...], spec: TensorSpec | None, count: int) -> tuple[int, ...]:
    """The model's own shape when the values fill a fixed shape of another
    rank (a model without a batch dimension, fed one instance); otherwise
    the values' shape."""
    if spec is None or not spec.shape or -1 in spec.shape:
        return shape
    if not _fits(shape, spec.shape) and int(np.prod(spec.shape)) == count:
        return tuple(spec.shape)
    return shape


def _numbers_tensor(name: str, where: str, numbers: JsonNumbers, spec: TensorSpec | None,
                    allowance: TensorAllowance) -> Tensor:
    """A tensor of numbers the fast reader read: what :func:`_tensor` makes
    of the same values as Python objects."""
    shape = numbers.shape
    element_count(shape, where, allowance.max_tensor_elements)
    if spec is not None and not spec.parameters.get(ANY_DATATYPE):
        datatype = spec.datatype
    else:
        datatype = "INT64" if numbers.values.size and numbers.values.dtype.kind in "iu" else "FP32"
    if datatype == "BYTES":
        raise invalid(f"{where}: BYTES values must be strings or {{\"b64\": \"...\"}} objects")
    if datatype == "BOOL":
        raise invalid(f"{where}: BOOL data must be true/false")
    count = allowance.claim(datatype, shape, where)
    array = array_from_json(numbers, datatype, shape, count, where)
    fitted = _fitted(shape, spec, count)
    _check_fit(where, fitted, spec)
    return Tensor(name, datatype, fitted, array.reshape(fitted))


def _check_fit(where: str, shape: tuple[int, ...], spec: TensorSpec | None) -> None:
    if spec is not None and spec.shape and not spec.parameters.get(ANY_DATATYPE) and not _fits(shape, spec.shape):
        raise invalid(f"{where}: values of shape {list(shape)} do not fit the model's shape {list(spec.shape)} "
                      "(-1: any size)")


def _tensor(name: str, value: Any, spec: TensorSpec | None, allowance: TensorAllowance,
            body: bytes | bytearray) -> Tensor:
    where = f"input '{name[:100]}'"
    if isinstance(value, JsonNumbers):
        return _numbers_tensor(name, where, value, spec, allowance)
    shape_list, leaves = _shape_and_leaves(value, where, allowance.max_tensor_elements)
    if spec is not None and not spec.parameters.get(ANY_DATATYPE):
        datatype = spec.datatype
    else:
        datatype = _datatype_of_values(leaves, where, body, allowance)
    shape = tuple(shape_list)
    count = allowance.claim(datatype, shape, where)
    if datatype == "BYTES":
        items = [_element_bytes(leaf, where) for leaf in leaves]
        allowance.claim_bytes_items(items, where)
        array = np.empty(count, dtype=object)
        array[:] = items
    else:
        array = array_from_json(leaves, datatype, (count,), count, where)
    shape = _fitted(shape, spec, count)
    _check_fit(where, shape, spec)
    return Tensor(name, datatype, shape, array.reshape(shape))


# --- answers ------------------------------------------------------------------


def text_or_b64(item: bytes) -> Any:
    """A BYTES element as V1 JSON: its text, or ``{"b64": ...}`` when it is not UTF-8."""
    try:
        return item.decode()
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(item).decode("ascii")}


BYTES_JSON = np.frompyfunc(text_or_b64, 1, 1)  # shared with upstream_codec.py


def _json_value(array: np.ndarray, datatype: str) -> Any:
    """An output's data as JSON (nested lists; orjson writes numeric numpy
    arrays itself, NaN as null)."""
    if datatype == "BYTES":
        return BYTES_JSON(array).tolist() if array.ndim else text_or_b64(array.item())
    if datatype == "BF16":
        array = bf16_to_float(array)
    if array.ndim == 0:
        return array.item()
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))


def answer_size(outputs: list[Tensor]) -> int:
    """An upper estimate of what :func:`encode_answer` builds (charged to the
    memory budget; it also chooses where the encoding runs)."""
    return sum(t.data.size * BYTES_ELEMENT_COST if t.datatype == "BYTES" else 32 * t.data.size for t in outputs)


def _per_row(tensor: Tensor, rows: int) -> np.ndarray:
    data = tensor.data
    if data.ndim and data.shape[0] == rows:
        return data
    if rows == 1:  # a model without a batch dimension answered the one instance
        return data[np.newaxis]
    raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                       f"output '{tensor.name}' has shape {list(data.shape)}, not one entry per instance ({rows})")


def encode_answer(outputs: list[Tensor], rows: int | None) -> bytes:
    """``predictions`` for a row request (one entry per instance: the value
    of a single output, else an ``{output: value}`` object), ``outputs``
    for a columnar one (the single output's value, else ``{output: value}``)."""
    if rows is None:
        if len(outputs) == 1:
            columns: Any = _json_value(outputs[0].data, outputs[0].datatype)
        else:
            columns = {t.name: _json_value(t.data, t.datatype) for t in outputs}
        return _dumps({"outputs": columns})
    stacked = [_per_row(t, rows) for t in outputs]
    if len(outputs) == 1:
        return _dumps({"predictions": _json_value(stacked[0], outputs[0].datatype)})
    predictions = [{t.name: _json_value(data[row, ...], t.datatype) for t, data in zip(outputs, stacked, strict=True)}
                   for row in range(rows)]
    return _dumps({"predictions": predictions})


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as exc:
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"the answer cannot be written as JSON: {exc}") from None


def encode_models(names: list[str]) -> bytes:
    return orjson.dumps({"models": names})


def encode_model_ready(name: str, ready: bool) -> bytes:
    return orjson.dumps({"name": name, "ready": ready})


# --- errors -------------------------------------------------------------------


def encode_error(error: GatewayError) -> tuple[int, bytes]:
    """``{"error": message}`` and the kind's HTTP status (errors.py)."""
    return STATUS_OF_KIND[error.kind], orjson.dumps({"error": error.message})
