"""Canonical, numpy-backed data model shared by every protocol.

Frontends decode their wire format into these types, backends encode them to
their upstream's wire format. Nothing in the middle of the gateway sees wire
bytes. Tensor data is always a numpy array whose shape equals the tensor
shape: numeric types use the matching little-endian dtype, BYTES an object
array of ``bytes``, BF16 a ``uint16`` array holding the raw bit patterns.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from gateway.core.errors import invalid, too_large
from gateway.core.record import REQUEST_ID_HEADER, TRACEPARENT_HEADER, TRACESTATE_HEADER, RequestRecord

# V2 datatype name -> numpy dtype (little-endian, as every wire form is).
NUMPY_DTYPES: Mapping[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),  # raw bfloat16 bit patterns
    "BYTES": np.dtype(object),
}
DATATYPES = frozenset(NUMPY_DTYPES)

# Fixed byte width per element; BYTES has none.
ELEMENT_SIZE: Mapping[str, int] = {
    name: dt.itemsize for name, dt in NUMPY_DTYPES.items() if name != "BYTES"
}

_DATATYPE_OF_DTYPE: Mapping[np.dtype[Any], str] = {
    dt.newbyteorder("="): name
    for name, dt in NUMPY_DTYPES.items()
    if name not in ("BF16", "BYTES")
}


def datatype_of(array: np.ndarray) -> str:
    """The V2 datatype name for a numpy array (object/str/bytes -> BYTES)."""
    if array.dtype.kind in "OSU":
        return "BYTES"
    try:
        return _DATATYPE_OF_DTYPE[array.dtype.newbyteorder("=")]
    except KeyError:
        raise invalid(f"numpy dtype {array.dtype} has no V2 datatype") from None


def check_datatype(datatype: Any, where: str) -> str:
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise invalid(f"{where}: unknown datatype {str(datatype)[:40]!r}")
    return datatype


# Most dimensions a tensor may have: numpy's own limit (32 before numpy 2,
# 64 since), so no shape a client sends can fail inside numpy.
MAX_DIMS = 32
# Bound on the product of a shape's non-zero dimensions even when its element
# count is 0: numpy refuses shapes whose span times the element size passes
# 2**63, such as [2**62, 4, 0].
MAX_SPAN = 1 << 56


def element_count(shape: Any, where: str, max_elements: int | None = None) -> int:
    """Validate a declared shape and return its element count.

    Runs before any allocation, on plain Python ints, so absurd shapes are
    rejected by arithmetic rather than by numpy: at most MAX_DIMS dimensions,
    and the non-zero dimensions (all of them, when there are elements) within
    ``max_elements`` (TOO_LARGE when there are elements, else INVALID) and
    MAX_SPAN.
    """
    if not isinstance(shape, (list, tuple)):
        raise invalid(f"{where}: shape must be a list of integers")
    if len(shape) > MAX_DIMS:
        raise invalid(f"{where}: shape has {len(shape)} dimensions, more than the {MAX_DIMS} a tensor may have")
    span = 1  # product of the non-zero dimensions
    empty = False
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise invalid(f"{where}: shape must be a list of integers, got {str(dim)[:40]!r}")
        if dim < 0:
            raise invalid(f"{where}: shape has a negative dimension {dim}")
        if dim == 0:
            empty = True
        else:
            span *= dim  # at most MAX_DIMS factors: a few thousand bits at worst
    bound = MAX_SPAN if max_elements is None else min(max_elements, MAX_SPAN)
    if span > bound:
        shown = _shown_shape(shape)
        if empty:
            raise invalid(f"{where}: shape {shown} has no elements, but its other dimensions multiply to {span}, "
                          f"over the limit of {bound}")
        if max_elements is not None and span > max_elements:
            raise too_large(f"{where}: shape {shown} has {span} elements, over the limit of {max_elements} "
                            "(limits.max_tensor_elements)")
        raise invalid(f"{where}: shape {shown} has {span} elements, more than a tensor can hold")
    return 0 if empty else span


def declared_shape(shape: Any, where: str) -> tuple[int, ...]:
    """A model's declared shape (metadata; -1 marks a variable dimension) as
    a tuple: INVALID unless it is at most MAX_DIMS integers >= -1 whose fixed
    dimensions multiply to at most MAX_SPAN."""
    if not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape):
        raise invalid(f"{where}: shape must hold integers >= -1")
    if len(shape) > MAX_DIMS:
        raise invalid(f"{where}: shape has {len(shape)} dimensions, more than the {MAX_DIMS} a tensor may have")
    if math.prod(d for d in shape if d > 0) > MAX_SPAN:
        raise invalid(f"{where}: shape {_shown_shape(shape)} is larger than a tensor can be")
    return tuple(shape)


def _shown_shape(shape: list[Any] | tuple[Any, ...]) -> str:
    text = str(list(shape))
    return text if len(text) <= 200 else text[:197] + "..."


@dataclass(slots=True)
class Tensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_numpy(cls, name: str, array: np.ndarray, datatype: str | None = None,
                   parameters: dict[str, Any] | None = None) -> Tensor:
        datatype = datatype or datatype_of(array)
        if datatype == "BYTES" and array.dtype != object:
            array = _to_bytes_array(array)
        elif datatype != "BYTES":
            array = np.ascontiguousarray(array, dtype=NUMPY_DTYPES[datatype])
        return cls(name, datatype, tuple(int(d) for d in array.shape), array, dict(parameters or {}))

    @property
    def element_count(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Wire size: raw bytes, or for BYTES the 4-byte-prefixed form."""
        if self.datatype == "BYTES":
            return sum(4 + len(item) for item in self.data.reshape(-1))
        return self.element_count * ELEMENT_SIZE[self.datatype]


def _to_bytes_array(array: np.ndarray) -> np.ndarray:
    out = np.empty(array.shape, dtype=object)
    flat_out = out.reshape(-1)
    for i, item in enumerate(array.reshape(-1)):
        flat_out[i] = item.encode() if isinstance(item, str) else bytes(item)
    return out


@dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RawPayload:
    """A request or response body exactly as one protocol put it on the wire.

    Lets a same-protocol hop forward bytes unchanged (a fast path that also
    preserves anything derived from the bytes, such as GraphStorm's
    ``request_uid``); adapters of other protocols ignore it.
    """

    protocol: str
    body: bytes | bytearray  # a bytearray is the buffer the body was read into, uncopied
    content_type: str = "application/json"
    # Wire headers that frame the body (V2 REST: Inference-Header-Content-Length).
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Handover:
    """A frontend's leave to let go of a request's tensor data once an
    upstream client's own message holds it, so that a big request is not
    held twice while the upstream works (docs/performance.md, "Big
    tensors"). The data plane's copies of the request share this object, so
    what one try did is known to the next."""

    # The frontend's side: drops its body buffer, the client's bytes and
    # the decoded inputs (the list every copy of the request shares).
    let_go: Callable[[], None]
    dropped: bool = False
    # The upstream client's message, kept for a retry to the same upstream
    # (so the same protocol) after the inputs were dropped; None when no
    # retry can use it.
    message: RawPayload | None = None

    def drop(self, message: RawPayload | None = None) -> None:
        """``message`` (or a batch, when None) holds the tensors now: the
        frontend lets go of its copies."""
        self.message = message
        self.let_go()
        self.dropped = True


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""
    id: str = ""
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    raw: RawPayload | None = None  # the client's own bytes, for same-protocol hops
    # Set by a frontend that reads no input once the upstream call began.
    handover: Handover | None = None


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str = ""
    id: str = ""
    outputs: list[Tensor] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    raw: RawPayload | None = None  # the upstream's own bytes, for same-protocol hops


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A model's declared input or output; -1 marks a variable dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...] = ()
    platform: str = ""
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestContext:
    """Transport facts about one request; never sent upstream as data."""

    listener: str
    protocol: str
    request_id: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    # Absolute time.monotonic() by which the answer is due; None = no deadline.
    deadline: float | None = None
    started: float = field(default_factory=time.monotonic)
    # W3C trace context as received (validated), forwarded upstream unchanged.
    traceparent: str = ""
    tracestate: str = ""
    # What metrics and the access log learn about this request (gateway.core.record).
    record: RequestRecord = field(default_factory=RequestRecord)
    # Headers an upstream client sends with the call: the route's allowlist
    # plus the request id and W3C trace context (set by the data plane).
    forward_headers: Mapping[str, str] = field(default_factory=dict)
    route: str = ""  # name of the route that matched (set by the data plane)
    # One entry per upstream try, retries and their endpoints included.
    attempts: list[UpstreamAttempt] = field(default_factory=list)
    # Set by the data plane from the route: send the client's Authorization
    # header upstream (UpstreamClient.request_headers); never by default.
    forward_authorization: bool = False
    # Set by a streaming listener whose client learns that a request has no
    # more responses without a final flag on the last one (an empty final
    # response, the end of an SSE reply): upstream responses then go on at
    # once instead of waiting to learn whether they are the last.
    end_marked: bool = False
    # (generation, model, version, route) of the last resolution: a request
    # is routed once, however many steps ask (set by the data plane).
    resolved: tuple[Any, str, str, Any] | None = None
    # Triton's `priority` request parameter (1 highest; 0 none), set by the data plane.
    priority: int = 0

    def remaining(self) -> float | None:
        if self.deadline is None:
            return None
        return self.deadline - time.monotonic()

    def upstream_headers(self) -> dict[str, str]:
        """What every upstream client sends on each call (HTTP headers or
        gRPC metadata): the route's allowlisted headers, the request id and
        the (validated) trace context."""
        headers = dict(self.forward_headers)  # the route's allowlist (set by the data plane)
        for name in (TRACEPARENT_HEADER, TRACESTATE_HEADER):
            headers.pop(name, None)  # forwarded only as validated below
        if self.request_id:
            headers[REQUEST_ID_HEADER] = self.request_id
        if self.traceparent:
            headers[TRACEPARENT_HEADER] = self.traceparent
            if self.tracestate:
                headers[TRACESTATE_HEADER] = self.tracestate
        return headers


# --- operations beyond infer ---------------------------------------------------

# Operation names for UpstreamClient.call_operation (via DataPlane.call_operation).
# An upstream that does not offer one raises UNSUPPORTED (the base class does).
DERIVATIVE_OPERATION = "derivative"  # arguments: Derivative -> 1-D float64 ndarray
# Metadata for the request's parameters (UM-Bridge sizes may depend on
# `config`); arguments: None -> ModelMetadata. Without it, model_metadata().
METADATA_OPERATION = "metadata_for_parameters"
# The model's configuration as the upstream keeps it (Triton's ModelConfig in
# its JSON form, a dict); arguments: None. Upstreams without it raise
# UNSUPPORTED and the gateway synthesizes one (gateway.protocols.triton.modelconfig).
MODEL_CONFIG_OPERATION = "model_config"

DERIVATIVE_KINDS = ("Gradient", "ApplyJacobian", "ApplyHessian")

# Parameters of the model-function contract (UM-Bridge's calls become
# canonical requests that any upstream may answer, the builtin models too):
# a request's model configuration as JSON text, and in model metadata the
# features a model offers ("Evaluate,Gradient,...").
CONFIG_PARAMETER = "umbridge_config"
SUPPORT_PARAMETER = "umbridge_support"
# In model metadata: the model answers zero or many responses per request
# (Triton's decoupled transaction policy), so only through a stream.
DECOUPLED_PARAMETER = "decoupled"


def config_from_text(text: Any) -> dict[str, Any]:
    """A request's CONFIG_PARAMETER as a dict ({} when absent)."""
    if text is None or text == "":
        return {}
    if not isinstance(text, str):
        raise invalid(f"request parameter '{CONFIG_PARAMETER}' must be a string holding a JSON object")
    try:
        config = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise invalid(f"request parameter '{CONFIG_PARAMETER}' is not valid JSON") from None
    if not isinstance(config, dict):
        raise invalid(f"request parameter '{CONFIG_PARAMETER}' must hold a JSON object")
    return config


@dataclass(frozen=True, slots=True)
class Derivative:
    """A derivative of a model at the point given by a request's inputs.

    Inputs and outputs are numbered in request order, each taken as one flat
    vector. With J the Jacobian of output ``out_wrt`` by input ``in_wrt``:
    Gradient = Jᵀ·sens, ApplyJacobian = J·vec, ApplyHessian = (Σₖ sensₖ ·
    ∂²outₖ / ∂in_wrt ∂in_wrt2)·vec. ``sens`` has the size of output
    ``out_wrt``; ``vec`` the size of input ``in_wrt`` (ApplyJacobian) or
    ``in_wrt2`` (ApplyHessian).
    """

    kind: str  # one of DERIVATIVE_KINDS
    out_wrt: int
    in_wrt: int
    in_wrt2: int = 0
    sens: np.ndarray | None = None
    vec: np.ndarray | None = None


@dataclass(slots=True)
class OperationRequest:
    """What an upstream's call_operation receives: the routed request (model
    name and version already rewritten) and the operation's own arguments."""

    request: InferRequest
    arguments: Any = None

@dataclass(slots=True)
class UpstreamAttempt:
    """One try of a request against one endpoint (for logs and metrics)."""

    upstream: str
    endpoint: str
    started: float  # time.monotonic()
    duration: float = 0.0
    outcome: str = "ok"  # "ok", or a failure reason / error kind value
