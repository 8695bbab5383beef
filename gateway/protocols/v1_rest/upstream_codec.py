"""V2 canonical tensors to a V1 server's JSON and back (the upstream side).

Requests: every input is split along its first (batch) dimension. Row form
(``instances``): one input gives one value or nested list per row; several
give one ``{input_name: value}`` object per row. Columnar form
(``inputs``): one input's whole value, or ``{input_name: value}``. BYTES
elements travel as JSON strings when they are UTF-8, else as
``{"b64": "..."}``; BF16 as numbers; non-finite floats as null (JSON has
no NaN). Request parameters travel as ``parameters``, less those that
only describe a V2 client's wire (``binary_data_output``).

Answers: ``predictions`` (row) or ``outputs`` (columnar). Row predictions
are stacked along a new first dimension; when every prediction is an
object, each key becomes its own output. Datatypes come from the model's
declared outputs (upstream options); otherwise from the JSON: booleans
BOOL, integers INT64 (past its range: UINT64 or FP64, as numpy reads
them), any fraction or null or NaN FP64, strings and ``{"b64"}`` objects
BYTES. Ragged or mixed answers are the upstream's
fault (UPSTREAM_BAD_RESPONSE, the caller's ``reading_reply``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from gateway.core.addresses import without_addresses
from gateway.core.errors import GatewayError, invalid, malformed
from gateway.core.jsontext import python_loads
from gateway.core.tensors import array_from_json, bf16_to_float
from gateway.core.types import InferRequest, Tensor, TensorSpec, element_count
from gateway.protocols.v1_rest.codec import BYTES_JSON
from gateway.protocols.v1_rest.errors import kind_of_upstream_status
from gateway.protocols.v1_rest.upstream_options import COLUMNAR, ROW

JSON_TYPE = "application/json"
B64_KEY = "b64"
ROW_ANSWER, COLUMNAR_ANSWER = "predictions", "outputs"
# Request parameters about how a V2 REST client's answer is encoded: no V1 server's business.
_WIRE_PARAMETERS = frozenset({"binary_data_output"})


# --- requests ------------------------------------------------------------------


def _json_value(tensor: Tensor) -> list[Any]:
    """The tensor as nested JSON lists (its first dimension outermost)."""
    if tensor.datatype == "BYTES":
        # Text or {"b64"} per element, as the V1 listener writes them.
        return BYTES_JSON(tensor.data.reshape(-1)).reshape(tensor.shape).tolist()  # type: ignore[no-any-return]
    data = bf16_to_float(tensor.data) if tensor.datatype == "BF16" else tensor.data
    return np.asarray(data).tolist()  # type: ignore[no-any-return]


def _batch(inputs: Sequence[Tensor], model: str) -> int:
    if not inputs:
        raise invalid(f"a request to V1 model '{model}' needs at least one input")
    sizes = set()
    for tensor in inputs:
        if not tensor.shape:
            raise invalid(f"input '{tensor.name}' is a scalar; V1 models take rows (a first, batch dimension)")
        sizes.add(tensor.shape[0])
    if len(sizes) > 1:
        shown = ", ".join(f"'{t.name}' {t.shape[0]}" for t in inputs[:8])
        raise invalid(f"the inputs of V1 model '{model}' must have as many rows each (first dimension): {shown}")
    return sizes.pop()


def encode_request(request: InferRequest, request_format: str) -> bytes:
    """The V1 body for ``request`` in ``request_format`` (ROW or COLUMNAR)."""
    rows = _batch(request.inputs, request.model_name)
    values = {tensor.name: _json_value(tensor) for tensor in request.inputs}
    body: dict[str, Any] = {}
    if request_format == COLUMNAR:
        body[COLUMNAR] = next(iter(values.values())) if len(values) == 1 else values
    elif len(values) == 1:
        body[ROW] = next(iter(values.values()))
    else:
        body[ROW] = [{name: value[i] for name, value in values.items()} for i in range(rows)]
    parameters = {k: v for k, v in request.parameters.items() if k not in _WIRE_PARAMETERS}
    if parameters:
        body["parameters"] = parameters
    return orjson.dumps(body)


# --- answers -------------------------------------------------------------------


def load_answer(data: bytes | bytearray, what: str = "the answer") -> dict[str, Any]:
    """A JSON object; TF Serving's ``NaN``/``Infinity`` literals (which
    orjson refuses) are read by Python's json."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        obj = _with_nonfinite_literals(data)
        if obj is None:
            raise malformed(f"{what} is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(obj, dict):
        raise malformed(f"{what} must be a JSON object")
    return obj


def _with_nonfinite_literals(data: bytes | bytearray) -> Any:
    if b"NaN" not in data and b"Infinity" not in data:
        return None
    try:
        return python_loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # UnportableJson is a ValueError
        return None


def _inferred_datatype(array: np.ndarray, where: str) -> str:
    kind = array.dtype.kind
    if kind == "b":
        return "BOOL"
    if kind == "i":
        return "INT64"
    if kind == "u":
        return "UINT64"
    if kind == "f":
        return "FP64"
    if kind == "O":
        leaves = array.reshape(-1)
        if all(isinstance(v, (str, dict)) for v in leaves):
            return "BYTES"
        if all(v is None or (type(v) in (int, float)) for v in leaves):
            return "FP64"  # numbers with nulls: null is how JSON writes NaN
    raise invalid(f"{where}: values must be all numbers, all booleans or all strings")


def _bytes_leaf(value: Any, where: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get(B64_KEY), str):
        try:
            return base64.b64decode(value[B64_KEY], validate=True)
        except (binascii.Error, ValueError):
            raise invalid(f"{where}: a {{\"b64\"}} value is not valid base64") from None
    raise invalid(f"{where}: BYTES values must be strings or {{\"b64\": ...}} objects")


def answer_tensor(name: str, value: Any, declared: str | None, where: str, max_elements: int) -> Tensor:
    """One output from its JSON ``value`` (nested lists, regular), of the
    ``declared`` datatype or the one its values suggest."""
    try:
        probe = np.array(value, dtype=object if _first_leaf_is_text(value) else None)
        if probe.dtype.kind == "U":  # numpy made text of every leaf: look at them as they came
            probe = np.array(value, dtype=object)
    except (ValueError, OverflowError):
        raise invalid(f"{where}: not a regular (non-ragged) array") from None
    shape = tuple(int(d) for d in probe.shape)
    count = element_count(list(shape), where, max_elements)
    datatype = declared or (_inferred_datatype(probe, where) if count else "FP64")
    if datatype == "BYTES":
        flat = probe.reshape(-1)
        array = np.empty(count, dtype=object)
        for i, item in enumerate(flat):
            array[i] = _bytes_leaf(item, where)
        return Tensor(name, "BYTES", shape, array.reshape(shape))
    data = value if isinstance(value, list) else [value]
    return Tensor(name, datatype, shape, array_from_json(data, datatype, shape, count, where))


def _first_leaf_is_text(value: Any) -> bool:
    """Whether ``value`` starts with a string or a {"b64"} object: then
    numpy keeps every leaf as it is (it would turn numbers among strings
    into strings, and cannot shape dicts). Follows first elements."""
    item: Any = value
    while isinstance(item, list) and item:
        item = item[0]
    return isinstance(item, (str, dict))


def decode_answer(data: bytes | bytearray, outputs: Sequence[TensorSpec], output_name: str,
                  max_elements: int) -> list[Tensor]:
    """A V1 answer's ``predictions`` or ``outputs`` as V2 output tensors.
    ``outputs``: the model's declared outputs (their datatypes; the only
    one's name for an unnamed answer), else ``output_name`` names it."""
    answer = load_answer(data)
    declared = {spec.name: spec.datatype for spec in outputs}
    single = outputs[0].name if len(outputs) == 1 else output_name
    if ROW_ANSWER in answer:
        value, rows = answer[ROW_ANSWER], True
    elif COLUMNAR_ANSWER in answer:
        value, rows = answer[COLUMNAR_ANSWER], False
    else:
        raise malformed(f"the answer has neither '{ROW_ANSWER}' nor '{COLUMNAR_ANSWER}'")
    named: dict[str, Any] | None = None
    if isinstance(value, dict) and not _is_b64(value):
        named = value  # columnar {name: batched value} (or predictions given so)
    elif rows and isinstance(value, list) and value and all(isinstance(v, dict) and not _is_b64(v) for v in value):
        keys = list(value[0])
        if any(set(v) != set(keys) for v in value):
            raise malformed(f"the '{ROW_ANSWER}' objects do not all have the same keys")
        named = {key: [v[key] for v in value] for key in keys}
    if named is None:
        where = f"'{ROW_ANSWER if rows else COLUMNAR_ANSWER}'"
        return [answer_tensor(single, value, declared.get(single), where, max_elements)]
    if not named:
        raise malformed("the answer names no outputs")
    return [answer_tensor(str(key), item, declared.get(str(key)), f"output '{str(key)[:64]}'", max_elements)
            for key, item in named.items()]


def _is_b64(value: dict[str, Any]) -> bool:
    return len(value) == 1 and B64_KEY in value


def decode_error(status: int, body: bytes | bytearray, upstream: str) -> GatewayError:
    """A V1 server's error answer (``{"error": "..."}``) as a gateway error;
    addresses in its words (a KServe transformer names its predictor's
    URL) are cut: clients see the message."""
    try:
        obj = orjson.loads(body)
        message = str(obj.get("error", ""))[:512] if isinstance(obj, dict) else ""
    except orjson.JSONDecodeError:
        message = ""
    detail = f"upstream '{upstream}' answered {status}" + (f": {without_addresses(message)}" if message else "")
    return GatewayError(kind_of_upstream_status(status), detail)
