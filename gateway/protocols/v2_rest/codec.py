"""Open Inference Protocol (V2) REST codec, with Triton's binary extension.

Pure functions, both directions: decode a client's request and encode our
response (frontend side), encode a request and decode a server's response
(backend side). No server imports, so golden tests need no sockets.

Binary layout (Triton's extension): the body is a JSON head of
``Inference-Header-Content-Length`` bytes followed by each binary tensor's
raw little-endian bytes in tensor order; BYTES elements are a uint32 LE length
followed by the bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from gateway.core import tensors
from gateway.core.errors import ErrorKind, GatewayError, invalid, malformed
from gateway.core.jsontext import UnportableJson, python_loads
from gateway.core.limits import TensorAllowance, check_json_depth, count_bytes
from gateway.core.tensors import (
    JsonNumbers,
    array_from_json,
    array_from_raw,
    array_to_json,
    array_to_raw,
    check_json_count,
    check_json_data,
)
from gateway.core.types import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    RawPayload,
    RequestedOutput,
    Tensor,
    TensorSpec,
    check_datatype,
    declared_shape,
)
from gateway.protocols.triton import shm
from gateway.protocols.v2_rest.errors import STATUS_OF_KIND, kind_of_upstream_status

if TYPE_CHECKING:
    from gateway.config.limits import Limits

PROTOCOL = "v2-rest"
HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY_DATA_SIZE = "binary_data_size"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"

_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
# How a tensor's JSON data is read: (data, datatype, shape, count, label, allowance) -> array.
ReadJson = Callable[[Any, str, tuple[int, ...], int, str, TensorAllowance | None], np.ndarray]


# --- errors ----------------------------------------------------------------


def encode_error(error: GatewayError) -> tuple[int, bytes]:
    return STATUS_OF_KIND[error.kind], orjson.dumps({"error": error.message})


def decode_error(status: int, body: bytes | bytearray, upstream: str) -> GatewayError:
    """An upstream's error answer as a gateway error (never passed through
    blindly: errors.py says what each status means)."""
    try:
        message = str(orjson.loads(body).get("error", ""))[:512]
    except (orjson.JSONDecodeError, AttributeError):
        message = ""
    detail = f"upstream '{upstream}' answered {status}" + (f": {message}" if message else "")
    return GatewayError(kind_of_upstream_status(status), detail)


# --- JSON helpers ----------------------------------------------------------


def _loads_nonfinite_literals(data: bytes | bytearray | memoryview, what: str) -> Any:
    """Python's json, which reads the NaN/Infinity/-Infinity literals Triton
    writes for non-finite values (orjson refuses them); None if it fails too.
    MALFORMED for what orjson refuses besides: lone surrogates, integers
    beyond 64 bits."""
    raw = bytes(data)
    if b"NaN" not in raw and b"Infinity" not in raw:
        return None
    try:
        return python_loads(raw.decode("utf-8"))
    except UnportableJson as exc:
        raise malformed(f"{what} is not valid JSON: {exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def load_json_object(data: bytes | bytearray | memoryview, what: str) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        obj = _loads_nonfinite_literals(data, what)
        if obj is None:
            raise malformed(f"{what} is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(obj, dict):
        raise malformed(f"{what} must be a JSON object")
    return obj


def load_infer_json(data: bytes | bytearray | memoryview, what: str, tensors_key: str,
                    charge: Callable[[int], None] | None = None) -> dict[str, Any]:
    """:func:`load_json_object` for an infer request (``tensors_key``
    "inputs") or answer ("outputs"): in a big text, the data of each numeric
    tensor is read straight into numpy (:class:`tensors.JsonNumbers`) when
    the fast reader can vouch for it; ``charge`` takes what its parser needs."""
    if len(data) >= tensors.FAST_JSON_MIN_BYTES:
        obj = tensors.read_json_fast(data, lambda root: _fast_infer_object(root, tensors_key), charge)
        if obj is not None:
            return obj
    return load_json_object(data, what)


def _fast_infer_object(root: Any, tensors_key: str) -> dict[str, Any]:
    """The parsed object as Python values, its tensors' data read by
    :func:`tensors.tensor_data`."""
    obj = tensors.json_fields(root)
    for key, value in obj.items():
        obj[key] = ([_fast_tensor(item) for item in value] if key == tensors_key and tensors.is_json_array(value)
                    else tensors.plain(value))
    return obj


def _fast_tensor(item: Any) -> Any:
    if not tensors.is_json_object(item):
        return tensors.plain(item)
    fields = tensors.json_fields(item)
    datatype = tensors.plain(fields.get("datatype"))
    for key, value in fields.items():
        fields[key] = (tensors.tensor_data(value, datatype) if key == "data" and isinstance(datatype, str)
                       else tensors.plain(value))
    return fields


def _optional(obj: dict[str, Any], key: str, kind: type, where: str, default: Any) -> Any:
    value = obj.get(key, default)
    if value is default:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise malformed(f"{where}: '{key}' must be {_KIND_NAMES.get(kind, kind.__name__)}")
    return value


_KIND_NAMES = {str: "a string", dict: "an object", list: "a list", int: "an integer", bool: "a boolean"}


def _required(obj: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in obj:
        raise malformed(f"{where}: missing '{key}'")
    return _optional(obj, key, kind, where, None)


# --- tensors in a JSON head --------------------------------------------------


def decode_tensors(items: Any, binary: memoryview, where: str, max_elements: int,
                   allowance: TensorAllowance | None = None, read_json: ReadJson = array_from_json) -> list[Tensor]:
    """Tensor objects of a request's ``inputs`` or a response's ``outputs``
    (JSON data read by ``read_json``).

    Two passes: every tensor's head is checked and claimed from ``allowance``
    (the request's totals) before any tensor data is allocated.
    """
    if not isinstance(items, list):
        raise malformed(f"'{where}s' must be a list")
    allowance = allowance if allowance is not None else TensorAllowance.unlimited(max_elements)
    heads: list[tuple[str, str, str, tuple[int, ...], int, dict[str, Any], Any, bool]] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise malformed(f"{where} #{index} must be an object")
        # Each field read once; anything but the plain type goes through
        # _required/_optional, which say what is wrong.
        name = item.get("name")
        if type(name) is not str:
            name = _required(item, "name", str, f"{where} #{index}")
        label = f"{where} '{name}'"
        datatype = item.get("datatype")
        if type(datatype) is not str:
            datatype = _required(item, "datatype", str, label)
        datatype = check_datatype(datatype, label)
        shape_list = item.get("shape")
        if type(shape_list) is not list:
            shape_list = _required(item, "shape", list, label)
        try:
            count = allowance.claim(datatype, shape_list, label)
        except GatewayError as error:
            # A shape over the limits whose JSON data plainly disagrees with it
            # is the client's mistake (400), not a request that is too big.
            if error.kind is ErrorKind.TOO_LARGE and isinstance(item.get("data"), list | JsonNumbers):
                check_json_count(item["data"], shape_list, label)
            raise
        given = item.get("parameters", _ABSENT)
        parameters = ({} if given is _ABSENT else dict(given) if type(given) is dict
                      else dict(_optional(item, "parameters", dict, label, {})))
        size = parameters.pop(BINARY_DATA_SIZE, None)
        shared = shm.in_shared_memory(parameters)
        if shared and (size is not None or "data" in item):
            raise malformed(f"{label}: has both '{shm.REGION}' and "
                            + ("'data'" if "data" in item else f"'{BINARY_DATA_SIZE}'"))
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise malformed(f"{label}: '{BINARY_DATA_SIZE}' must be a non-negative integer")
            if "data" in item:
                raise malformed(f"{label}: has both 'data' and '{BINARY_DATA_SIZE}'")
        elif not shared and "data" not in item:
            raise malformed(f"{label}: has neither 'data' nor '{BINARY_DATA_SIZE}'")
        heads.append((name, label, datatype, tuple(shape_list), count, parameters, size, shared))
    tensors: list[Tensor] = []
    offset = 0
    for (name, label, datatype, shape, count, parameters, size, shared), item in zip(heads, items, strict=True):
        if size is not None:
            if offset + size > len(binary):
                raise invalid(f"{label}: {BINARY_DATA_SIZE} {size} overruns the binary data "
                              f"({len(binary) - offset} bytes left)")
            data = array_from_raw(binary[offset:offset + size], datatype, shape, count, label, allowance)
            offset += size
        elif shared:
            data = shm.placeholder(datatype)  # read from the region by the frontend (extensions/shm.py)
        else:
            data = read_json(item["data"], datatype, shape, count, label, allowance)
        tensors.append(Tensor(name, datatype, shape, data, parameters))
    if offset != len(binary):
        raise invalid(f"{len(binary) - offset} bytes of binary data follow the last binary {where} "
                      f"(binary_data_size values do not add up to the body)")
    return tensors


_ABSENT = object()  # a field the object does not have


def split_body(body: bytes | bytearray, header_length: str | None) -> tuple[memoryview, memoryview]:
    """JSON head and binary tail, per ``Inference-Header-Content-Length``."""
    view = memoryview(body)
    if header_length is None:
        return view, view[len(view):]
    try:
        length = int(header_length)
    except ValueError:
        raise malformed(f"{HEADER_LENGTH} must be an integer, got {header_length[:40]!r}") from None
    if length < 0 or length > len(view):
        raise malformed(f"{HEADER_LENGTH} {length} is outside the body of {len(view)} bytes")
    return view[:length], view[length:]


def decode_infer_request(body: bytes | bytearray, header_length: str | None, model: str, version: str,
                         max_elements: int, limits: Limits | None = None, *, keep_raw: bool = False,
                         depth_checked: bool = False, charge: Callable[[int], None] | None = None) -> InferRequest:
    """A client's infer request; ``limits`` (the gateway's) adds the
    request-wide tensor allowance and the JSON nesting bound (unless the caller
    has ``depth_checked`` it); ``charge`` takes what decoding will allocate
    beyond the body (the memory budget). ``keep_raw``: the request keeps the
    client's bytes (``raw``) for a pass-through, unless its JSON might hold a
    duplicate key (see :func:`_single_keys`)."""
    head, binary = split_body(body, header_length)
    # a binary request's head is small; a JSON one is the whole body (no copy)
    text = body if header_length is None else bytes(head)
    if limits is not None and not depth_checked:
        check_json_depth(text, limits.max_json_depth, "the request")
    obj = load_infer_json(text, "the request", "inputs", charge)
    request_id = _optional(obj, "id", str, "request", "")
    parameters = dict(_optional(obj, "parameters", dict, "request", {}))
    allowance = TensorAllowance.of(limits, charge) if limits is not None else None
    inputs = decode_tensors(_required(obj, "inputs", list, "request"), binary, "input", max_elements, allowance)
    outputs: list[RequestedOutput] = []
    for index, item in enumerate(_optional(obj, "outputs", list, "request", [])):
        if not isinstance(item, dict):
            raise malformed(f"output #{index} must be an object")
        name = _required(item, "name", str, f"output #{index}")
        outputs.append(RequestedOutput(name, dict(_optional(item, "parameters", dict, f"output '{name}'", {}))))
    request = InferRequest(model, version, request_id, inputs, outputs, parameters)
    if keep_raw and _single_keys(text, obj):
        request.raw = (RawPayload(PROTOCOL, body) if header_length is None
                       else RawPayload(PROTOCOL, body, BINARY_TYPE, {HEADER_LENGTH: str(len(head))}))
    return request


_ESCAPED_COLONS = (b"\\u003a", b"\\u003A")
# Below this size a body's parsed JSON is written back whole for the count.
_SKELETON_MIN_BYTES = 64 << 10


def _single_keys(text: bytes | bytearray, obj: dict[str, Any]) -> bool:
    """Whether the JSON ``text`` (parsed as ``obj``, its data checked) holds
    no duplicate key, so that a reader keeping the first of two keys sees
    what the gateway (orjson: the last one wins) checked.

    Counted at C speed instead of parsed again: every key is followed by one
    colon, and strings hold the same colons in the text (raw or escaped) as
    in ``obj`` written back. A duplicate key, or the strings of a value it
    replaced, add colons only to the text, so equal counts mean no duplicate
    (unequal counts may also come from an escaped backslash before "u003a":
    rare, and then the request is simply translated). Numeric data holds no
    colons and is left out of the count.
    """
    (in_text,) = count_bytes(text, b":")
    if text.find(b"\\") != -1:  # one fast scan; numeric bodies have no escapes to count
        in_text += sum(text.count(escaped) for escaped in _ESCAPED_COLONS)
    if len(text) < _SKELETON_MIN_BYTES:  # written back whole: cheaper than building the skeleton
        return in_text == orjson.dumps(obj, default=_numbers_as_null).count(b":")
    skeleton = dict(obj)
    skeleton["inputs"] = [{**item, "data": None} if "data" in item and item.get("datatype") != "BYTES" else item
                          for item in obj["inputs"]]
    return in_text == orjson.dumps(skeleton, default=_numbers_as_null).count(b":")


def _numbers_as_null(item: Any) -> None:
    """Numbers read by the fast reader hold no colon (nor do they as text)."""
    if not isinstance(item, JsonNumbers):
        raise TypeError


# --- encoding tensors --------------------------------------------------------


def _tensor_head(tensor: Tensor, binary_size: int | None) -> dict[str, Any]:
    head: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
    parameters = {k: v for k, v in tensor.parameters.items() if k not in (BINARY_DATA_SIZE, "binary_data")}
    if binary_size is not None:
        parameters[BINARY_DATA_SIZE] = binary_size
    if parameters:
        head["parameters"] = parameters
    return head


def encode_tensors(tensors: Iterable[Tensor], binary_flags: Iterable[bool]) -> tuple[list[dict[str, Any]], list[Any]]:
    heads: list[dict[str, Any]] = []
    chunks: list[Any] = []
    for tensor, as_binary in zip(tensors, binary_flags, strict=True):
        if shm.written(tensor):  # answered as Triton does: no data, no parameters
            head = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        elif as_binary:
            raw = array_to_raw(tensor)
            head = _tensor_head(tensor, memoryview(raw).nbytes)
            chunks.append(raw)
        else:
            head = _tensor_head(tensor, None)
            head["data"] = array_to_json(tensor)
        heads.append(head)
    return heads, chunks


def body_parts(head: dict[str, Any], chunks: list[Any]) -> tuple[list[Any], dict[str, str]]:
    """The body as its parts (JSON head, then each binary tensor as a view of
    its array, uncopied) and the headers: plain JSON, or head + binary tail."""
    try:
        head_bytes = orjson.dumps(head, option=_JSON_OPTIONS)
    except orjson.JSONEncodeError as exc:  # e.g. a name from a GraphStorm client holding a lone surrogate
        raise invalid(f"a tensor or parameter cannot be written as V2 JSON: {exc}") from None
    if not chunks:
        return [head_bytes], {"Content-Type": JSON_TYPE}
    return [head_bytes, *chunks], {"Content-Type": BINARY_TYPE, HEADER_LENGTH: str(len(head_bytes))}


def join_body(head: dict[str, Any], chunks: list[Any]) -> tuple[bytes, dict[str, str]]:
    """Body and headers: plain JSON, or JSON head + binary tail."""
    parts, headers = body_parts(head, chunks)
    return parts[0] if len(parts) == 1 else b"".join(parts), headers


def output_binary_flags(response: InferResponse, request: InferRequest) -> list[bool]:
    """Which outputs go binary: per-output ``binary_data`` wins over the
    request-level ``binary_data_output``; JSON by default."""
    default = request.parameters.get("binary_data_output") is True
    asked = {o.name: o.parameters.get("binary_data") for o in request.outputs}
    flags = []
    for tensor in response.outputs:
        choice = asked.get(tensor.name)
        flags.append(choice if isinstance(choice, bool) else default)
    return flags


def encode_infer_response(response: InferResponse, request: InferRequest) -> tuple[bytes, dict[str, str]]:
    parts, headers = encode_infer_response_parts(response, request)
    return parts[0] if len(parts) == 1 else b"".join(parts), headers


def encode_infer_response_parts(response: InferResponse, request: InferRequest) -> tuple[list[Any], dict[str, str]]:
    """:func:`encode_infer_response` as body parts (see :func:`body_parts`)."""
    heads, chunks = encode_tensors(response.outputs, output_binary_flags(response, request))
    head: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        head["id"] = response.id
    parameters = {k: v for k, v in response.parameters.items() if k != "binary_data_output"}
    if parameters:
        head["parameters"] = parameters
    head["outputs"] = heads
    return body_parts(head, chunks)


def binary_outputs_requested(request: InferRequest) -> bool:
    """Whether the client asked for any output as binary data (request-level
    ``binary_data_output`` or an output's ``binary_data``)."""
    if request.parameters.get("binary_data_output") is True:
        return True
    return any(o.parameters.get("binary_data") is True for o in request.outputs)


def renamed_response(body: bytes | bytearray, header_length: str | None, model_name: str,
                     model_version: str | None) -> tuple[list[Any], dict[str, str]]:
    """An upstream's answer with the model name (and version, unless None)
    the client asked for. Only the JSON head is rewritten: its keys keep
    their order and anything the gateway does not know stays; a binary
    tail is not copied (the last part is a view of ``body``)."""
    head, tail = split_body(body, header_length)
    try:
        obj = orjson.loads(head)
        nonfinite = False
    except orjson.JSONDecodeError:
        obj = _loads_nonfinite_literals(head, "the response")  # Triton's NaN/Infinity literals, written back as such
        nonfinite = True
    if not isinstance(obj, dict):
        raise malformed("the response is not a JSON object")
    obj["model_name"] = model_name
    if model_version is not None:
        obj["model_version"] = model_version
    try:
        new_head = (json.dumps(obj, separators=(",", ":")).encode() if nonfinite else orjson.dumps(obj))
    except (orjson.JSONEncodeError, ValueError, RecursionError):
        raise malformed("the response cannot be written back as JSON") from None
    if header_length is None:
        return [new_head], {"Content-Type": JSON_TYPE}
    return [new_head, tail], {"Content-Type": BINARY_TYPE, HEADER_LENGTH: str(len(new_head))}


def encode_infer_request(request: InferRequest, binary: bool) -> tuple[bytes, dict[str, str]]:
    """A request for an upstream V2 REST server, JSON or binary inputs."""
    heads, chunks = encode_tensors(request.inputs, [binary] * len(request.inputs))
    head: dict[str, Any] = {}
    if request.id:
        head["id"] = request.id
    parameters = dict(request.parameters)
    parameters.pop("binary_data_output", None)
    if binary:
        parameters["binary_data_output"] = True
    if parameters:
        head["parameters"] = parameters
    head["inputs"] = heads
    if request.outputs:
        head["outputs"] = [
            {"name": o.name, "parameters": {**o.parameters, "binary_data": binary}} if binary
            else ({"name": o.name, "parameters": {k: v for k, v in o.parameters.items() if k != "binary_data"}}
                  if o.parameters else {"name": o.name})
            for o in request.outputs
        ]
    return join_body(head, chunks)


def decode_infer_response(body: bytes | bytearray, header_length: str | None, max_elements: int) -> InferResponse:
    return _read_infer_response(body, header_length, max_elements, array_from_json)


def check_infer_response(body: bytes | bytearray, header_length: str | None, max_elements: int) -> None:
    """:func:`decode_infer_response`'s checks and errors, for an answer
    relayed as its bytes: small JSON data is checked without being made
    arrays (binary data is read as views either way)."""
    _read_infer_response(body, header_length, max_elements, check_json_data)


def _read_infer_response(body: bytes | bytearray, header_length: str | None, max_elements: int,
                         read_json: ReadJson) -> InferResponse:
    head, binary = split_body(body, header_length)
    obj = load_infer_json(head, "the response", "outputs")
    outputs = decode_tensors(_required(obj, "outputs", list, "response"), binary, "output", max_elements,
                             read_json=read_json)
    return InferResponse(
        model_name=_optional(obj, "model_name", str, "response", ""),
        model_version=_optional(obj, "model_version", str, "response", ""),
        id=_optional(obj, "id", str, "response", ""),
        outputs=outputs,
        parameters=dict(_optional(obj, "parameters", dict, "response", {})),
    )


# --- metadata ----------------------------------------------------------------


def _spec_json(spec: TensorSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}
    if spec.parameters:
        out["parameters"] = dict(spec.parameters)
    return out


def encode_model_metadata(metadata: ModelMetadata) -> bytes:
    obj: dict[str, Any] = {
        "name": metadata.name,
        "versions": list(metadata.versions),
        "platform": metadata.platform,
        "inputs": [_spec_json(s) for s in metadata.inputs],
        "outputs": [_spec_json(s) for s in metadata.outputs],
    }
    if metadata.parameters:
        obj["parameters"] = dict(metadata.parameters)
    return orjson.dumps(obj)


def _spec_from_json(item: Any, where: str) -> TensorSpec:
    if not isinstance(item, dict):
        raise malformed(f"{where} must be an object")
    name = _required(item, "name", str, where)
    datatype = _required(item, "datatype", str, where)
    shape = declared_shape(_required(item, "shape", list, where), where)
    return TensorSpec(name, datatype, shape, dict(_optional(item, "parameters", dict, where, {})))


def decode_model_metadata(body: bytes | bytearray) -> ModelMetadata:
    obj = load_json_object(body, "model metadata")
    versions = _optional(obj, "versions", list, "model metadata", [])
    return ModelMetadata(
        name=_required(obj, "name", str, "model metadata"),
        versions=tuple(str(v) for v in versions),
        platform=_optional(obj, "platform", str, "model metadata", ""),
        inputs=tuple(_spec_from_json(x, f"metadata input #{i}")
                     for i, x in enumerate(_optional(obj, "inputs", list, "model metadata", []))),
        outputs=tuple(_spec_from_json(x, f"metadata output #{i}")
                      for i, x in enumerate(_optional(obj, "outputs", list, "model metadata", []))),
        parameters=dict(_optional(obj, "parameters", dict, "model metadata", {})),
    )


def encode_server_metadata(name: str, version: str, extensions: list[str]) -> bytes:
    return orjson.dumps({"name": name, "version": version, "extensions": extensions})
