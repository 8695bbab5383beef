"""The payload_log filter: each request and answer of a route as a
CloudEvent to an HTTP sink (KServe's inference logger semantics).

A request becomes an ``org.kubeflow.serving.inference.request`` event, its
answer an ``org.kubeflow.serving.inference.response`` event (each answer
of a stream one), both with ``ce-id`` = the request id, ``ce-source`` naming
the gateway and the route, and the model and the client's protocol as
extension attributes. The body is V2 JSON whatever protocol the client
spoke: tensors as the V2 REST protocol writes them, each tensor above
``max_tensor_bytes`` (and any past ``max_event_bytes`` in one event) as its
name, datatype and shape only, marked as omitted.

The request path only writes the event (it must: the frontend lets go of
a request's tensors once the upstream has them) and queues it; sending is
the :class:`EventSink`'s, off the path. ``sample`` picks requests by a hash
of their id, so a request's two events are logged or skipped together.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.config.node import Node
from gateway.core.errors import GatewayError
from gateway.core.tensors import array_to_json
from gateway.core.types import InferRequest, InferResponse, RawPayload, Tensor
from gateway.dataplane.filters.base import STREAM, Filter, FilterCall
from gateway.dataplane.filters.eventsink import Event, EventSink, SinkAddress, header_value
from gateway.observability.metrics import metrics_of
from gateway.runtime.services import GatewayServices

log = logging.getLogger(__name__)

MODES = ("all", "request", "response")
REQUEST_TYPE = "org.kubeflow.serving.inference.request"
RESPONSE_TYPE = "org.kubeflow.serving.inference.response"
REQUEST_TYPE_LINE = f"ce-type: {REQUEST_TYPE}\r\n"
RESPONSE_TYPE_LINE = f"ce-type: {RESPONSE_TYPE}\r\n"
# Where a tensor's data was left out, its parameters say why and how big it was.
OMITTED = "data_omitted"
OMITTED_BYTES = "data_bytes"
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
# Tensor data longer than this is written in steps of this many elements,
# the event loop let go between them: ~0.5 ms of FP32 each.
STEP_ELEMENTS = 16384
# Datatypes whose numpy data orjson writes as it is (flat, once contiguous):
# all but BYTES (strings) and BF16 (bit patterns, written as floats).
_PLAIN_NUMBERS = frozenset(("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                            "FP16", "FP32", "FP64"))
# An event body being written: (head, the key of its tensors, the tensors as JSON items).
Unwritten = tuple[dict[str, Any], str, list[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class PayloadLogOptions:
    url: str
    mode: str = "all"  # all | request | response
    sample: float = 1.0  # the fraction of requests logged
    max_queue: int = 10000  # events waiting for the sink; past it new ones are dropped
    max_queue_bytes: int = 64 << 20  # their bytes (each event charged to the memory budget until sent)
    max_tensor_bytes: int = 64 << 10  # a tensor larger than this is logged as metadata only
    max_event_bytes: int = 1 << 20  # tensor data in one event; tensors past it as metadata only
    timeout: float = 5.0  # one event's send, connecting included
    connections: int = 2  # keep-alive connections (and senders) to the sink
    headers: SinkHeaders = field(default_factory=lambda: SinkHeaders(()))  # sent with every event


class SinkHeaders:
    """Headers sent with every event (e.g. Authorization). Their values
    may be secrets: shown nowhere (/config shows the type's name only, the
    repr the names only); equal by value, so an unchanged policy keeps its
    filter across a reload."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: tuple[tuple[str, str], ...]) -> None:
        self.pairs = pairs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SinkHeaders) and other.pairs == self.pairs

    def __hash__(self) -> int:
        return hash(self.pairs)

    def __repr__(self) -> str:
        return f"SinkHeaders({[name for name, _ in self.pairs]})"


class PayloadLogFilter(Filter):
    kind = "payload_log"

    def __init__(self, name: str, options: PayloadLogOptions, services: GatewayServices) -> None:
        super().__init__(name, options, services)
        self.log_requests = options.mode != "response"
        self.log_responses = options.mode != "request"
        # Requests whose id hashes below this are logged (2**32: all of them).
        self.sample_below = round(options.sample * (1 << 32))
        self.server = header_value(services.identity.name)
        self.sources: dict[str, str] = {}  # route name -> its ce-source header line
        self.protocols: dict[str, str] = {}  # client protocol -> its ce-protocol header line
        self.stream_index = f"{name}.stream_index"  # in FilterCall.notes: a stream's answers so far
        self.sink = EventSink(SinkAddress.parse(options.url), options.headers.pairs, options.timeout,
                              options.connections, options.max_queue, options.max_queue_bytes, services.budget,
                              metrics_of(services).record_payload_log)

    @classmethod
    def parse_options(cls, node: Node) -> PayloadLogOptions | None:
        defaults = PayloadLogOptions("")
        if not node.is_mapping:
            node.error("must be a mapping with at least 'url'")
            return None
        url = node.string("url")
        if isinstance(url, str):
            try:
                SinkAddress.parse(url)
            except ValueError as exc:
                node.error(str(exc), "url")
        sample = node.get("sample", float, defaults.sample)
        if isinstance(sample, float) and not 0.0 <= sample <= 1.0:
            node.error(f"must be between 0 and 1, got {sample}", "sample")
        options = PayloadLogOptions(
            url=url if isinstance(url, str) else "",
            mode=node.choice("mode", MODES, defaults.mode),
            sample=sample,
            max_queue=node.integer("max_queue", defaults.max_queue, minimum=1),
            max_queue_bytes=_positive_size(node, "max_queue_bytes", defaults.max_queue_bytes),
            max_tensor_bytes=node.size("max_tensor_bytes", defaults.max_tensor_bytes),
            max_event_bytes=node.size("max_event_bytes", defaults.max_event_bytes),
            timeout=_positive_duration(node, "timeout", defaults.timeout),
            connections=node.integer("connections", defaults.connections, minimum=1),
            headers=_headers(node.child("headers", {})),
        )
        if isinstance(options.connections, int) and options.connections > 64:
            node.error(f"must be at most 64, got {options.connections}", "connections")
        node.check_no_unknown_keys()
        return options

    @classmethod
    def options_schema(cls) -> dict[str, Any]:
        size, duration = {"$ref": "#/$defs/Size"}, {"$ref": "#/$defs/Duration"}
        return {"type": "object", "required": ["url"], "additionalProperties": False, "properties": {
            "url": {"type": "string", "description": "the sink: an http:// or https:// URL"},
            "mode": {"enum": list(MODES), "default": "all", "description": "which side is logged"},
            "sample": {"type": "number", "minimum": 0, "maximum": 1, "default": 1.0,
                       "description": "the fraction of requests logged"},
            "max_queue": {"type": "integer", "minimum": 1, "default": 10000},
            "max_queue_bytes": {**size, "default": "64MiB"},
            "max_tensor_bytes": {**size, "default": "64KiB",
                                 "description": "larger tensors are logged as metadata only"},
            "max_event_bytes": {**size, "default": "1MiB"},
            "timeout": {**duration, "default": "5s"},
            "connections": {"type": "integer", "minimum": 1, "maximum": 64, "default": 2},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}}}}

    # --- the request path -------------------------------------------------------

    async def on_request(self, call: FilterCall) -> InferResponse | None:
        if self.log_requests and self._sampled(call) and self.sink.has_room():
            try:
                body = self._request_body(call.request)
                if type(body) is not bytes:
                    body = await write_in_steps(*body)
            except Exception as exc:  # a value JSON cannot carry: the event is lost, never the request
                self._unwritten(exc)
                return None
            self.sink.offer(Event(self._attributes(call) + REQUEST_TYPE_LINE, body, time.time()))
        return None

    async def on_response(self, call: FilterCall, response: InferResponse) -> InferResponse:
        if self.log_responses and self._sampled(call) and self.sink.has_room():
            head = self._attributes(call) + RESPONSE_TYPE_LINE
            if call.kind == STREAM:  # a stream's answers are numbered from 0
                count = call.notes.get(self.stream_index, 0)
                call.notes[self.stream_index] = count + 1
                head += f"ce-streamindex: {count}\r\n"
            try:
                body = self._response_body(response)
                if type(body) is not bytes:
                    body = await write_in_steps(*body)
            except Exception as exc:
                self._unwritten(exc)
                return response
            self.sink.offer(Event(head, body, time.time()))
        return response

    def _unwritten(self, exc: Exception) -> None:
        self.sink.drop()
        log.warning("payload log %s: an event could not be written as JSON (%s); dropped", self.name,
                    type(exc).__name__)

    def _sampled(self, call: FilterCall) -> bool:
        below = self.sample_below
        if below >= 1 << 32:
            return True
        return zlib.crc32(self._id(call).encode()) < below

    @staticmethod
    def _id(call: FilterCall) -> str:
        return call.ctx.request_id or call.request.id

    def _attributes(self, call: FilterCall) -> str:
        """The ``ce-`` header lines a request's events share (ce-type and
        ce-time apart), written once per request."""
        notes = call.notes
        head: str | None = notes.get(self.name)
        if head is not None:
            return head
        route = call.route.name
        source = self.sources.get(route)
        if source is None:
            source = self.sources[route] = f"ce-source: /{self.server}/routes/{header_value(route)}\r\n"
        protocol = call.ctx.protocol
        protocol_line = self.protocols.get(protocol)
        if protocol_line is None:
            protocol_line = self.protocols[protocol] = f"ce-protocol: {header_value(protocol)}\r\n"
        request = call.request
        version = f"ce-modelversion: {header_value(request.model_version)}\r\n" if request.model_version else ""
        head = notes[self.name] = (f"ce-specversion: 1.0\r\nce-id: {header_value(self._id(call))}\r\n{source}"
                                   f"ce-modelname: {header_value(request.model_name)}\r\n{version}{protocol_line}")
        return head

    # --- V2 JSON ----------------------------------------------------------------

    def _request_body(self, request: InferRequest) -> bytes | Unwritten:
        if not request.inputs and request.raw is not None:
            return self._relayed(request.raw, {"id": request.id})
        head: dict[str, Any] = {"id": request.id} if request.id else {}
        if request.parameters:
            head["parameters"] = request.parameters
        if request.outputs:
            head["outputs"] = [{"name": o.name, "parameters": o.parameters} if o.parameters else {"name": o.name}
                               for o in request.outputs]
        return self._with_tensors(head, "inputs", request.inputs)

    def _response_body(self, response: InferResponse) -> bytes | Unwritten:
        named = {"model_name": response.model_name, "model_version": response.model_version}
        if response.id:
            named["id"] = response.id
        if not response.outputs and response.raw is not None:
            return self._relayed(response.raw, named)
        head: dict[str, Any] = dict(named)
        if response.parameters:
            head["parameters"] = response.parameters
        return self._with_tensors(head, "outputs", response.outputs)

    def _with_tensors(self, head: dict[str, Any], key: str, tensors: list[Tensor]) -> bytes | Unwritten:
        """``head`` with the tensors under ``key``, written at once; or,
        when a tensor's data is long, what :func:`write_in_steps` writes."""
        room = [self.options.max_event_bytes, 0]
        items = [self._tensor(tensor, room) for tensor in tensors]
        if room[1] > STEP_ELEMENTS:
            return head, key, items
        head[key] = items
        return _dumps(head)

    def _tensor(self, tensor: Tensor, room: list[int]) -> dict[str, Any]:
        """A tensor as V2 JSON; its data only if within the size limits.
        ``room``: the data bytes the event may still hold, and the longest
        data so far (elements)."""
        item: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        array = tensor.data
        if tensor.datatype in _PLAIN_NUMBERS:  # the common case, without a call
            size = array.nbytes
            why = "max_tensor_bytes" if size > self.options.max_tensor_bytes else None
        else:
            size, why = _size(tensor, self.options.max_tensor_bytes)
        if why is None and size > room[0]:
            why = "max_event_bytes"
        if why is None:
            try:
                data = array.reshape(-1) if tensor.datatype in _PLAIN_NUMBERS else array_to_json(tensor)
            except GatewayError:  # BYTES that are not UTF-8: JSON cannot carry them
                why = "not UTF-8"
            else:
                room[0] -= size
                if len(data) > room[1]:
                    room[1] = len(data)
                if tensor.parameters:
                    item["parameters"] = tensor.parameters
                item["data"] = data
                return item
        item["parameters"] = {**tensor.parameters, OMITTED: why, OMITTED_BYTES: size}
        return item

    def _relayed(self, raw: RawPayload, named: dict[str, Any]) -> bytes:
        """A body the gateway relayed without decoding it (a pass-through
        between like protocols): logged as it came when it is plain JSON
        within max_event_bytes (for V2 REST that is V2 JSON), else as
        metadata only."""
        size = len(raw.body)
        if raw.content_type.startswith("application/json") and not raw.headers \
                and size <= self.options.max_event_bytes:
            return bytes(raw.body)
        return _dumps({**named, "parameters": {OMITTED: "relayed undecoded", OMITTED_BYTES: size}})

    async def close(self) -> None:
        await self.sink.close()


async def write_in_steps(head: dict[str, Any], key: str, items: list[dict[str, Any]]) -> bytes:
    """An event body with long tensor data, written STEP_ELEMENTS elements
    at a time with the event loop let go between steps (orjson holds the
    interpreter: a pool thread would not free the loop)."""
    parts = []
    for item in items:
        data = item.get("data")
        if data is None or len(data) <= STEP_ELEMENTS:
            parts.append(_dumps(item))
            continue
        del item["data"]
        steps = []
        for start in range(0, len(data), STEP_ELEMENTS):
            steps.append(_dumps(data[start:start + STEP_ELEMENTS])[1:-1])  # the elements, without [ ]
            await asyncio.sleep(0)
        parts.append(_dumps(item)[:-1] + b',"data":[' + b",".join(steps) + b"]}")
    prefix = _dumps(head)[:-1]
    return b"".join((prefix, b"," if len(prefix) > 1 else b"", _dumps(key), b":[", b",".join(parts), b"]}"))


def _size(tensor: Tensor, limit: int) -> tuple[int, str | None]:
    """The tensor's data size, and why it is too big to log (None: it is not)."""
    if tensor.datatype != "BYTES":
        size = tensor.data.nbytes
        return size, ("max_tensor_bytes" if size > limit else None)
    count = tensor.data.size
    if count * 4 > limit:  # each element takes at least its 4-byte length
        return count * 4, "max_tensor_bytes"
    size = tensor.nbytes
    return size, ("max_tensor_bytes" if size > limit else None)


def _dumps(value: Any) -> bytes:
    return orjson.dumps(value, default=str, option=_JSON_OPTIONS)


def _positive_size(node: Node, key: str, default: int) -> int:
    value: int = node.size(key, default)
    if isinstance(value, int) and value <= 0:
        node.error("must be more than 0", key)
    return value


def _positive_duration(node: Node, key: str, default: float) -> float:
    value: float = node.duration(key, default)
    if isinstance(value, float) and value <= 0:
        node.error("must be more than 0", key)
    return value


def _headers(node: Node) -> SinkHeaders:
    """``headers: {name: value}``: sent with every event (values are never logged)."""
    found = []
    for name, item in node.entries():
        value = item.value
        if not name or any(c in name for c in ' \t\r\n:') or name.lower().startswith("ce-") \
                or name.lower() in ("host", "content-length", "content-type", "transfer-encoding", "connection"):
            item.error("must be a header name the sender does not write itself (not ce-*, Host, Content-*)")
        elif not isinstance(value, str) or not value.isascii() or any(c in value for c in "\r\n"):
            item.error("must be ASCII text on one line")
        else:
            found.append((name, value))
    return SinkHeaders(tuple(found))
