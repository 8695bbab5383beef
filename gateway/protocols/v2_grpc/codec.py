"""Open Inference Protocol (V2) gRPC codec: protobuf messages <-> canonical types.

Pure functions, both directions: decode a client's request and encode our
answer (frontend side), encode a request and decode a server's answer
(backend side). No server or channel code here.

Tensor data travels either as ``raw_*_contents`` (one bytes entry per
tensor, the same little-endian layout as REST's binary extension) or as
typed ``contents``. One message must not mix the two forms.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import orjson
from google.protobuf.message import DecodeError

from gateway.core.errors import (
    GatewayError,
    UpstreamFailure,
    connect_failure,
    connection_reset,
    invalid,
    malformed,
)
from gateway.core.limits import TensorAllowance
from gateway.core.tensors import array_from_raw, array_to_raw
from gateway.core.types import (
    NUMPY_DTYPES,
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestedOutput,
    Tensor,
    TensorSpec,
    check_datatype,
    declared_shape,
)
from gateway.protocols.triton import shm
from gateway.protocols.v2_grpc import messages as pb
from gateway.protocols.v2_grpc import rawwire
from gateway.protocols.v2_grpc.errors import CODE_OF_KIND, kind_of_upstream_code

if TYPE_CHECKING:
    from gateway.config.limits import Limits
    from gateway.core.record import RequestRecord

# Datatype -> the InferTensorContents field that carries it. FP16 and BF16
# have none: they travel only raw.
TYPED_FIELD: Mapping[str, str] = MappingProxyType({
    "BOOL": "bool_contents",
    "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
})

# Parameters that belong to REST's binary extension; they mean nothing on gRPC.
REST_ONLY_PARAMETERS = frozenset({"binary_data_output", "binary_data", "binary_data_size"})

_INT64 = (-(1 << 63), (1 << 63) - 1)
_UINT64_MAX = (1 << 64) - 1


# --- errors ------------------------------------------------------------------


def encode_error(error: GatewayError) -> tuple[grpc.StatusCode, str]:
    return CODE_OF_KIND[error.kind], error.message


def recorded_error(error: GatewayError, record: RequestRecord) -> tuple[grpc.StatusCode, str]:
    """:func:`encode_error`, with the status and the failure noted on the request's record."""
    code, message = encode_error(error)
    record.status = code.name
    record.fail(error.kind.value, error.message)
    return code, message


# How grpc core words UNAVAILABLE when the transport failed rather than the
# server answering: the call never left ("failed to connect to all
# addresses; last error: ... Connection refused") or the connection died
# under it ("Stream removed (Socket closed)", "Connection reset by peer").
_NEVER_CONNECTED = ("failed to connect",)
_CONNECTION_BROKE = ("socket closed", "connection reset", "broken pipe", "stream removed", "goaway")


def transport_failure(code: grpc.StatusCode, details: str | None, upstream: str) -> UpstreamFailure | None:
    """A retry-relevant transport failure hidden in an UNAVAILABLE status, so
    retry policies (``connect-failure``, ``reset``) and outlier detection
    treat gRPC upstreams like HTTP ones; None for anything else."""
    if code is not grpc.StatusCode.UNAVAILABLE:
        return None
    text = (details or "").lower()
    if any(marker in text for marker in _NEVER_CONNECTED):
        return connect_failure(upstream, (details or "")[:512])
    if any(marker in text for marker in _CONNECTION_BROKE):
        return connection_reset(upstream, (details or "")[:512])
    return None


def decode_error(code: grpc.StatusCode, details: str | None, upstream: str) -> GatewayError:
    """An upstream's gRPC status as a gateway error naming the upstream."""
    failure = transport_failure(code, details, upstream)
    if failure is not None:
        return failure
    kind = kind_of_upstream_code(code, details)
    detail = (details or "")[:512]
    said = "is unavailable" if code is grpc.StatusCode.UNAVAILABLE else f"answered {code.name}"
    return GatewayError(kind, f"upstream {upstream} {said}" + (f": {detail}" if detail else ""))


# --- metadata ----------------------------------------------------------------

_METADATA_VALUE = re.compile(r"[\x20-\x7e]*")


def metadata(headers: Mapping[str, str]) -> tuple[tuple[str, str], ...] | None:
    """Headers as the metadata of an upstream call. gRPC carries only
    printable ASCII in (non-binary) values, and grpc raises on anything else
    before the call leaves: a client's header that is not (UTF-8 text, or
    bytes that are not UTF-8 at all) is not forwarded rather than failing
    the call."""
    return tuple((name, value) for name, value in headers.items() if _METADATA_VALUE.fullmatch(value)) or None


# --- parameters ----------------------------------------------------------------


def parameters_from_proto(source: Any) -> dict[str, Any]:
    if not source:  # the common case, and iterating an empty protobuf map is not free
        return {}
    out: dict[str, Any] = {}
    for key, value in source.items():
        which = value.WhichOneof("parameter_choice")
        if which is not None:
            out[key] = getattr(value, which)
    return out


def parameters_to_proto(parameters: Mapping[str, Any], target: Any) -> None:
    """Fill a ``map<string, InferParameter>``. Values gRPC cannot carry
    (objects, lists, null, integers beyond 64 bits) travel as JSON text."""
    for key, value in parameters.items():
        if key in REST_ONLY_PARAMETERS:
            continue
        slot = target[key]
        if isinstance(value, bool):
            slot.bool_param = value
        elif isinstance(value, int) and _INT64[0] <= value <= _INT64[1]:
            slot.int64_param = value
        elif isinstance(value, int) and 0 <= value <= _UINT64_MAX:
            slot.uint64_param = value
        elif isinstance(value, float):
            slot.double_param = value
        elif isinstance(value, str):
            slot.string_param = value
        elif isinstance(value, int):
            slot.string_param = str(value)
        else:
            slot.string_param = orjson.dumps(value, default=str).decode()


# --- tensors -------------------------------------------------------------------


def _typed_array(contents: Any, datatype: str, shape: tuple[int, ...], count: int, where: str,
                 allowance: TensorAllowance) -> np.ndarray:
    field = TYPED_FIELD.get(datatype)
    if field is None:
        raise invalid(f"{where}: {datatype} has no typed contents field; send it as raw contents")
    for descriptor, _ in contents.ListFields():
        if descriptor.name != field:
            raise invalid(f"{where}: {datatype} data must be in '{field}', not '{descriptor.name}'")
    values = getattr(contents, field)
    if len(values) != count:
        raise invalid(f"{where}: has {len(values)} elements in '{field}' but shape {list(shape)} needs {count}")
    if datatype == "BYTES":
        items = list(values)
        allowance.claim_bytes_items(items, where)
        array = np.empty(count, dtype=object)
        array[:] = items
        return array.reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    if datatype in ("INT8", "INT16", "UINT8", "UINT16") and count:
        wide = np.fromiter(values, dtype=np.int64, count=count)
        limits = np.iinfo(dtype)
        if wide.min() < limits.min or wide.max() > limits.max:
            raise invalid(f"{where}: a value is out of range for {datatype}")
        return wide.astype(dtype).reshape(shape)
    return np.fromiter(values, dtype=dtype, count=count).reshape(shape)


def decode_tensors(items: Any, raw_contents: Any, where: str, max_elements: int,
                   allowance: TensorAllowance | None = None) -> list[Tensor]:
    """Input tensors of a request, or output tensors of a response. Every
    shape is claimed from ``allowance`` before any tensor data is read."""
    allowance = allowance if allowance is not None else TensorAllowance.unlimited(max_elements)
    items = list(items)  # each walk of a protobuf repeated field makes its element wrappers anew
    raw = list(raw_contents)
    # Inputs in a shared-memory region have no raw contents entry (tritonclient, Triton).
    shared = [shm.REGION in item.parameters for item in items]
    if raw:
        # An empty contents message next to raw data is no mix (MLServer sends one).
        if any(item.HasField("contents") and item.contents.ListFields() for item in items):
            raise invalid(f"the message mixes raw_{where}_contents with typed {where} contents; use one form")
        if len(raw) != shared.count(False):
            raise invalid(f"the message has {len(raw)} raw_{where}_contents entries for "
                          f"{shared.count(False)} {where}s")
    heads: list[tuple[str, str, str, tuple[int, ...], int]] = []
    for index, item in enumerate(items):
        name = item.name
        if not name:
            raise malformed(f"{where} #{index} has no name")
        label = f"{where} '{name[:100]}'"
        datatype = check_datatype(item.datatype, label)
        shape = tuple(item.shape)
        heads.append((name, label, datatype, shape, allowance.claim(datatype, shape, label)))
    tensors = []
    raw_index = 0
    for index, (item, (name, label, datatype, shape, count)) in enumerate(zip(items, heads, strict=True)):
        if shared[index]:
            if item.HasField("contents") and item.contents.ListFields():
                raise invalid(f"{label}: has both '{shm.REGION}' and contents")
            data = shm.placeholder(datatype)  # read from the region by the frontend (extensions/shm.py)
        elif raw:
            data = array_from_raw(memoryview(raw[raw_index]), datatype, shape, count, label, allowance)
            raw_index += 1
        elif item.HasField("contents"):
            data = _typed_array(item.contents, datatype, shape, count, label, allowance)
        elif count == 0:
            data = np.empty(shape, dtype=NUMPY_DTYPES[datatype])
        else:
            raise invalid(f"{label}: has no data (neither contents nor raw_{where}_contents)")
        tensors.append(Tensor(name, datatype, shape, data, parameters_from_proto(item.parameters)))
    return tensors


def _fill_typed(tensor: Tensor, contents: Any) -> None:
    values = getattr(contents, TYPED_FIELD[tensor.datatype])
    flat = tensor.data.reshape(-1)
    values.extend(list(flat) if tensor.datatype == "BYTES" else flat.tolist())


def encode_tensors(tensors: Iterable[Tensor], items: Any, typed: bool) -> list[Any]:
    """Append tensors to a repeated tensor field, their data typed when
    ``typed`` and every datatype has a typed field; else (one message must
    not mix the two forms) return the raw contents, in order, for
    :func:`rawwire.serialize` to put on the wire without copying them."""
    tensors = list(tensors)
    typed = typed and all(t.datatype in TYPED_FIELD for t in tensors)
    raw: list[Any] = []
    for tensor in tensors:
        item = items.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        if shm.written(tensor):  # as Triton answers: no parameters, an empty raw entry
            if not typed:
                raw.append(b"")
            continue
        parameters_to_proto(tensor.parameters, item.parameters)
        if typed:
            _fill_typed(tensor, item.contents)
        else:
            raw.append(array_to_raw(tensor))
    return raw


def _parse(data: bytes | memoryview, message_class: Any, raw_field: str) -> tuple[Any, list[memoryview]]:
    """A message with its raw contents as zero-copy views into ``data``."""
    name = message_class.DESCRIPTOR.full_name
    try:
        head, raw = rawwire.split(data, message_class.DESCRIPTOR.fields_by_name[raw_field].number)
        return message_class.FromString(head), raw
    except GatewayError as error:
        raise malformed(f"not a valid {name} message: {error.message}") from None
    except DecodeError:
        raise malformed(f"not a valid {name} message") from None


def _serialize(message: Any, raw_field: str, raw: list[Any]) -> bytes:
    return rawwire.serialize(message, message.DESCRIPTOR.fields_by_name[raw_field].number, raw)


# --- frontend: client requests in, our answers out -------------------------------


class RequestError(GatewayError):
    """A request that was read far enough to be named failed: the error,
    with the request's id, model and version (what a ModelStreamInfer error
    response carries beside the message)."""

    def __init__(self, error: GatewayError, request_id: str, model_name: str, model_version: str) -> None:
        super().__init__(error.kind, error.message)
        self.id, self.model_name, self.model_version = request_id, model_name, model_version


def decode_infer_request(data: bytes | memoryview, max_elements: int, limits: Limits | None = None,
                         charge: Callable[[int], None] | None = None) -> InferRequest:
    """A serialized ModelInferRequest; raw inputs stay views into ``data``.
    ``limits`` (the gateway's) adds the request-wide tensor allowance;
    ``charge`` takes what decoding will allocate beyond the message."""
    message, raw = _parse(data, pb.ModelInferRequest, "raw_input_contents")
    try:
        if not message.model_name:
            raise malformed("the request has no model_name")
        allowance = TensorAllowance.of(limits, charge) if limits is not None else None
        inputs = decode_tensors(message.inputs, raw, "input", max_elements, allowance)
        outputs = [RequestedOutput(o.name, parameters_from_proto(o.parameters)) for o in message.outputs]
        parameters = parameters_from_proto(message.parameters)
    except GatewayError as error:
        raise RequestError(error, message.id, message.model_name, message.model_version) from None
    return InferRequest(message.model_name, message.model_version, message.id, inputs, outputs, parameters)


def encode_infer_response(response: InferResponse, typed: bool = False) -> bytes:
    """A serialized ModelInferResponse."""
    message = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version,
                                    id=response.id)
    parameters_to_proto(response.parameters, message.parameters)
    raw = encode_tensors(response.outputs, message.outputs, typed)
    return _serialize(message, "raw_output_contents", raw)


def encode_model_metadata(metadata: ModelMetadata) -> Any:
    message = pb.ModelMetadataResponse(name=metadata.name, versions=list(metadata.versions),
                                       platform=metadata.platform)
    for specs, target in ((metadata.inputs, message.inputs), (metadata.outputs, message.outputs)):
        for spec in specs:
            target.add(name=spec.name, datatype=spec.datatype, shape=spec.shape)
    return message


def encode_server_metadata(name: str, version: str, extensions: list[str]) -> Any:
    return pb.ServerMetadataResponse(name=name, version=version, extensions=extensions)


# --- backend: our requests out, upstream answers in --------------------------------


def encode_infer_request(request: InferRequest) -> bytes:
    """A serialized request for an upstream V2 gRPC server; always raw
    contents (every server reads them, and they are the only form for
    FP16/BF16)."""
    try:
        message = pb.ModelInferRequest(model_name=request.model_name, model_version=request.model_version,
                                       id=request.id)
        parameters_to_proto(request.parameters, message.parameters)
        raw = encode_tensors(request.inputs, message.inputs, typed=False)
        for output in request.outputs:
            parameters_to_proto(output.parameters, message.outputs.add(name=output.name).parameters)
    except UnicodeEncodeError:  # e.g. a name from a GraphStorm payload holding a lone surrogate
        raise invalid("a name or parameter of the request is not Unicode text (a lone surrogate); "
                      "protobuf cannot carry it") from None
    return _serialize(message, "raw_input_contents", raw)


def decode_infer_response(data: bytes | memoryview, max_elements: int) -> InferResponse:
    """A serialized ModelInferResponse; raw outputs stay views into ``data``."""
    return decode_infer_response_form(data, max_elements)[0]


def decode_infer_response_form(data: bytes | memoryview, max_elements: int) -> tuple[InferResponse, bool]:
    """:func:`decode_infer_response`, and whether the outputs' data came in
    ``raw_output_contents`` (else typed, or there was none)."""
    message, raw = _parse(data, pb.ModelInferResponse, "raw_output_contents")
    outputs = decode_tensors(message.outputs, raw, "output", max_elements)
    return InferResponse(message.model_name, message.model_version, message.id, outputs,
                         parameters_from_proto(message.parameters)), bool(raw)


def decode_model_metadata(message: Any) -> ModelMetadata:
    def specs(items: Any) -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec(t.name, t.datatype, declared_shape(list(t.shape), f"metadata of '{t.name[:100]}'"))
                     for t in items)

    return ModelMetadata(message.name, tuple(message.versions), message.platform,
                         specs(message.inputs), specs(message.outputs))
