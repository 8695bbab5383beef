"""UM-Bridge protocol 1.0 codec: pure functions, both directions.

Downstream: decode a client's call (structure first, values later so the
frontend can keep the reference check order: model, feature, input) and
encode our answers and errors. Upstream: encode calls to a UM-Bridge server
and decode its answers and errors. No server imports.

JSON has no NaN or infinities. Incoming, we accept what real peers send for
them: ``NaN``/``Infinity``/``-Infinity`` literals (Python's json module),
``null`` (nlohmann::json, used by the C++ implementation) and, from upstream
answers only, Python's ``nan``/``inf`` reprs (the Python reference server).
Outgoing, a :data:`NONFINITE_POLICIES` choice decides.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from gateway.core.errors import ErrorKind, GatewayError, invalid, malformed
from gateway.core.jsontext import UnportableJson, python_loads
from gateway.core.types import (  # the contract's parameters live with the canonical types: re-exported
    CONFIG_PARAMETER,  # noqa: F401
    DERIVATIVE_KINDS,
    Derivative,
    config_from_text,  # noqa: F401
)
from gateway.protocols.umbridge.errors import ERROR_TYPES, kind_of_upstream_error

PROTOCOL = "umbridge"  # RawPayload.protocol of UM-Bridge bodies (pass-through)
PROTOCOL_VERSION = 1.0
JSON_TYPE = "application/json"
FEATURES = ("Evaluate", *DERIVATIVE_KINDS)

# How non-finite numbers leave: "null" (valid JSON, as nlohmann::json writes
# them), "literal" (NaN/Infinity/-Infinity, which Python's json reads) or
# "error" (answer InvalidOutput rather than lose the value).
NONFINITE_POLICIES = ("null", "literal", "error")

_NUMBER_TYPES = frozenset({int, float, type(None)})
_JSON_NAMES = {str: "a string", bool: "a boolean", list: "a list", dict: "an object"}
# Python's repr of non-finite floats, as the reference server writes them.
_PY_NONFINITE = re.compile(r"(?<![\w.\"])(-?)(nan|inf)(?![\w\"])")


# --- JSON --------------------------------------------------------------------


def _loads(body: bytes | bytearray, allow_python_repr: bool) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        error = exc
    # Slow path only for what orjson refuses: non-finite literals.
    try:
        text = body.decode()
        if allow_python_repr:
            text = _PY_NONFINITE.sub(lambda m: m.group(1) + ("NaN" if m.group(2) == "nan" else "Infinity"), text)
        return python_loads(text)
    except UnportableJson as exc:
        raise malformed(f"the body is not valid JSON: {exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise malformed(f"the body is not valid JSON: {error.msg} at position {error.pos}") from None


def load_object(body: bytes | bytearray, what: str, allow_python_repr: bool = False) -> dict[str, Any]:
    if not body.strip():
        raise malformed(f"{what} is empty; expected a JSON object")
    obj = _loads(body, allow_python_repr)
    if not isinstance(obj, dict):
        raise malformed(f"{what} must be a JSON object, got {_json_name(obj)}")
    return obj


def _json_name(value: Any) -> str:
    if value is None:
        return "null"
    return _JSON_NAMES.get(type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _finite_or_policy(arrays: Iterable[np.ndarray], policy: str, what: str) -> bool:
    """True when every value is finite; raises for policy "error"."""
    for index, array in enumerate(arrays):
        if array.size and not np.isfinite(array).all():
            if policy == "error":
                raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                                   f"{what} {index} holds NaN or infinity, which JSON cannot carry")
            return False
    return True


def dumps(obj: dict[str, Any], arrays: Sequence[np.ndarray], policy: str, what: str = "output") -> bytes:
    """``obj`` as JSON; ``arrays`` are the float64 vectors inside it, checked
    for non-finite values under ``policy``."""
    if _finite_or_policy(arrays, policy, what) or policy == "null":
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)  # orjson writes NaN/inf as null
    return json.dumps(obj, default=lambda a: a.tolist(), separators=(",", ":")).encode()


def config_text(config: Any) -> str:
    """The canonical text of a config: the request parameter and cache key."""
    return orjson.dumps(config, option=orjson.OPT_SORT_KEYS).decode()


# --- vectors -------------------------------------------------------------------


def vector(value: Any, where: str) -> np.ndarray:
    """A JSON list of numbers as float64 (null -> NaN); an array is one the
    fast reader already read (umbridge/passthrough.py)."""
    if isinstance(value, np.ndarray):
        return value
    if not isinstance(value, list):
        raise invalid(f"{where} must be a list of numbers, got {_json_name(value)}")
    if not set(map(type, value)) <= _NUMBER_TYPES:
        bad = next(v for v in value if type(v) not in _NUMBER_TYPES)
        raise invalid(f"{where} must hold only numbers, found {_json_name(bad)}")
    try:
        return np.array(value, dtype=np.float64)
    except OverflowError:
        raise invalid(f"{where} holds an integer too large for a double") from None


def vectors(value: Any, sizes: Sequence[int], where: str) -> list[np.ndarray]:
    """``input``: a list of number lists matching ``sizes``, checked count first."""
    if not isinstance(value, list):
        raise invalid(f"'{where}' must be a list of lists of numbers, got {_json_name(value)}")
    if len(value) != len(sizes):
        raise invalid(f"'{where}' has {len(value)} vectors but the model takes {len(sizes)}")
    out = []
    for index, (item, size) in enumerate(zip(value, sizes, strict=True)):
        if isinstance(item, list | np.ndarray) and len(item) != size:
            raise invalid(f"'{where}' vector {index} has length {len(item)} but the model expects {size}")
        out.append(vector(item, f"'{where}' vector {index}"))
    return out


def _index(body: dict[str, Any], key: str, count: int, what: str) -> int:
    if key not in body:
        raise invalid(f"missing '{key}'")
    value = body[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{key}' must be an integer, got {_json_name(value)}")
    if not 0 <= value < count:
        raise invalid(f"'{key}' is {value} but the model has {count} {what}; expected 0 to {count - 1}")
    return value


def _sized_vector(body: dict[str, Any], key: str, size: int, against: str) -> np.ndarray:
    if key not in body:
        raise invalid(f"missing '{key}'")
    value = body[key]
    if isinstance(value, list) and len(value) != size:
        raise invalid(f"'{key}' has length {len(value)} but {against} has size {size}")
    return vector(value, f"'{key}'")


# --- downstream: calls from UM-Bridge clients -------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    """A client's call after structural checks; values are checked later."""

    name: str
    config: dict[str, Any]
    body: dict[str, Any]

    @property
    def config_text(self) -> str:
        return config_text(self.config) if self.config else ""


def decode_call(body: bytes | bytearray) -> Call:
    return call_of(load_object(body, "the request body"))


def call_of(obj: dict[str, Any]) -> Call:
    """The structural checks of :func:`decode_call` on a parsed body."""
    name = obj.get("name")
    if name is None:
        raise malformed("the request has no model 'name'")
    if not isinstance(name, str):
        raise malformed(f"'name' must be a string, got {_json_name(name)}")
    config = obj.get("config", {})
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise malformed(f"'config' must be a JSON object, got {_json_name(config)}")
    return Call(name, config, obj)


def decode_inputs(call: Call, input_sizes: Sequence[int]) -> list[np.ndarray]:
    if "input" not in call.body:
        raise invalid("missing 'input'")
    return vectors(call.body["input"], input_sizes, "input")


def decode_derivative(kind: str, call: Call, input_sizes: Sequence[int], output_sizes: Sequence[int]) -> Derivative:
    """Indices and sens/vec of a derivative call, in the reference order
    (outWrt, inWrt, then vector lengths); inputs are checked before this."""
    body = call.body
    out_wrt = _index(body, "outWrt", len(output_sizes), "outputs")
    if kind == "ApplyHessian":
        in_wrt = _index(body, "inWrt1", len(input_sizes), "inputs")
        in_wrt2 = _index(body, "inWrt2", len(input_sizes), "inputs")
    else:
        in_wrt = in_wrt2 = _index(body, "inWrt", len(input_sizes), "inputs")
    sens = vec = None
    if kind in ("Gradient", "ApplyHessian"):
        sens = _sized_vector(body, "sens", output_sizes[out_wrt], f"output {out_wrt}")
    if kind in ("ApplyJacobian", "ApplyHessian"):
        vec = _sized_vector(body, "vec", input_sizes[in_wrt2], f"input {in_wrt2}")
    return Derivative(kind, out_wrt, in_wrt, in_wrt2 if kind == "ApplyHessian" else 0, sens, vec)


def encode_info(models: Sequence[str]) -> bytes:
    return orjson.dumps({"protocolVersion": PROTOCOL_VERSION, "models": list(models)})


def encode_sizes(key: str, sizes: Sequence[int]) -> bytes:
    return orjson.dumps({key: [int(s) for s in sizes]})


def encode_support(support: Iterable[str]) -> bytes:
    supported = set(support)
    return orjson.dumps({"support": {feature: feature in supported for feature in FEATURES}})


def encode_outputs(outputs: Sequence[np.ndarray], policy: str) -> bytes:
    arrays = [np.ascontiguousarray(o, dtype=np.float64).reshape(-1) for o in outputs]
    return dumps({"output": arrays}, arrays, policy)


def encode_vector_output(output: np.ndarray, policy: str) -> bytes:
    array = np.ascontiguousarray(output, dtype=np.float64).reshape(-1)
    return dumps({"output": array}, [array], policy)


def encode_error(error: GatewayError) -> tuple[int, bytes]:
    error_type, status = ERROR_TYPES[error.kind]
    return status, orjson.dumps({"error": {"type": error_type, "message": error.message}})


# --- upstream: calls to UM-Bridge servers --------------------------------------


def encode_request(name: str, config: dict[str, Any], inputs: Sequence[np.ndarray] | None = None,
                   derivative: Derivative | None = None, policy: str = "literal") -> bytes:
    """The body of InputSizes/OutputSizes/ModelInfo (no inputs), Evaluate
    (inputs) or a derivative call (inputs and derivative)."""
    obj: dict[str, Any] = {"name": name, "config": config}
    arrays: list[np.ndarray] = []
    if inputs is not None:
        obj["input"] = [np.ascontiguousarray(x, dtype=np.float64).reshape(-1) for x in inputs]
        arrays += obj["input"]
    if derivative is not None:
        obj["outWrt"] = derivative.out_wrt
        if derivative.kind == "ApplyHessian":
            obj["inWrt1"], obj["inWrt2"] = derivative.in_wrt, derivative.in_wrt2
        else:
            obj["inWrt"] = derivative.in_wrt
        for key in ("sens", "vec"):
            value = getattr(derivative, key)
            if value is not None:
                obj[key] = np.ascontiguousarray(value, dtype=np.float64)
                arrays.append(obj[key])
    return dumps(obj, arrays, policy, "input")


def _field(obj: dict[str, Any], key: str, upstream: str) -> Any:
    if key not in obj:
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"upstream {upstream} answered without '{key}'")
    return obj[key]


def _bad(upstream: str, problem: str) -> GatewayError:
    return GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"upstream {upstream} answered {problem}")


def decode_answer(body: bytes | bytearray, upstream: str) -> dict[str, Any]:
    try:
        return load_object(body, "the answer", allow_python_repr=True)
    except GatewayError as exc:
        raise _bad(upstream, f"with a bad body: {exc.message}") from None


def decode_info(obj: dict[str, Any], upstream: str) -> list[str]:
    version = _field(obj, "protocolVersion", upstream)
    if isinstance(version, bool) or not isinstance(version, (int, float)) or float(version) != PROTOCOL_VERSION:
        raise _bad(upstream, f"protocolVersion {str(version)[:20]}; the gateway speaks {PROTOCOL_VERSION}")
    models = _field(obj, "models", upstream)
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise _bad(upstream, "'models' that is not a list of names")
    return models


def decode_sizes(obj: dict[str, Any], key: str, upstream: str) -> tuple[int, ...]:
    sizes = _field(obj, key, upstream)
    if not isinstance(sizes, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in sizes):
        raise _bad(upstream, f"'{key}' that is not a list of non-negative integers")
    return tuple(sizes)


def decode_support(obj: dict[str, Any], upstream: str) -> frozenset[str]:
    support = _field(obj, "support", upstream)
    if not isinstance(support, dict):
        raise _bad(upstream, "'support' that is not an object")
    return frozenset(f for f in FEATURES if support.get(f) is True)


def decode_outputs(obj: dict[str, Any], upstream: str) -> list[np.ndarray]:
    output = _field(obj, "output", upstream)
    if not isinstance(output, list):
        raise _bad(upstream, "an 'output' that is not a list of lists")
    try:
        return [vector(item, f"output vector {i}") for i, item in enumerate(output)]
    except GatewayError as exc:
        raise _bad(upstream, f"a bad output: {exc.message}") from None


def decode_vector_output(obj: dict[str, Any], upstream: str) -> np.ndarray:
    try:
        return vector(_field(obj, "output", upstream), "output")
    except GatewayError as exc:
        if exc.kind == ErrorKind.UPSTREAM_BAD_RESPONSE:
            raise
        raise _bad(upstream, f"a bad output: {exc.message}") from None


def decode_error(status: int, obj: dict[str, Any] | None, upstream: str) -> GatewayError:
    """An upstream's error as a gateway error (its status is never passed on)."""
    error = obj.get("error") if obj else None
    error_type = message = ""
    if isinstance(error, dict):
        error_type = str(error.get("type", ""))[:64]
        message = str(error.get("message", ""))[:512]
    detail = f"upstream {upstream} answered {status}" + (f" {error_type}" if error_type else "") + (
        f": {message}" if message else "")
    return GatewayError(kind_of_upstream_error(error_type, status), detail)
