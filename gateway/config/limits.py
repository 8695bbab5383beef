"""The `limits:` section: request, listener, connection and memory bounds
(docs/security.md#limits).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.node import Node

DEFAULT_MAX_REQUEST_BYTES = 64 << 20
# Hardening limits (docs/security.md lists each with its reason).
DEFAULT_MAX_REQUEST_ELEMENTS = 1 << 26  # every wire form spends >= 1 byte per element
DEFAULT_MAX_REQUEST_TENSOR_BYTES = 256 << 20  # JSON numbers inflate up to 4x into FP64
DEFAULT_MAX_BYTES_ELEMENT = 16 << 20
DEFAULT_MAX_JSON_DEPTH = 64
# Arrays and objects in one JSON body: each costs ~0.1 µs of held interpreter
# to build and free, so this bounds one body's parse to ~25 ms of it.
DEFAULT_MAX_JSON_CONTAINERS = 1 << 18
MAX_JSON_DEPTH = 254  # deeper documents cannot be written back by orjson
DEFAULT_MAX_HEADER_LINE_BYTES = 8190  # aiohttp's own default
DEFAULT_MAX_HEADERS = 100
DEFAULT_MAX_GRPC_METADATA_BYTES = 16 << 10
DEFAULT_IDLE_TIMEOUT = 75.0  # above common load balancers' 60 s idle, as nginx
DEFAULT_BODY_TIMEOUT = 60.0
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_MAX_CONCURRENT_REQUESTS = 256
DEFAULT_MAX_OPEN_STREAMS = 128
DEFAULT_MAX_STREAM_REQUESTS = 16
DEFAULT_STREAM_BUFFER_RESPONSES = 16
# Per worker: bodies and decoded tensors of every request in flight together
# (docs/security.md#memory-budget gives the worst case per worker).
DEFAULT_MAX_INFLIGHT_BYTES = 512 << 20


@dataclass(frozen=True, slots=True)
class Limits:
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    # Upper bound on the elements of one tensor, checked before allocating.
    max_tensor_elements: int = 1 << 31
    # Hardening (docs/security.md#limits): per request, per listener, per connection.
    max_request_elements: int = DEFAULT_MAX_REQUEST_ELEMENTS  # all tensors of a request together
    max_request_tensor_bytes: int = DEFAULT_MAX_REQUEST_TENSOR_BYTES  # decoded size, all tensors
    max_bytes_element: int = DEFAULT_MAX_BYTES_ELEMENT  # one element of a BYTES tensor
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH  # nesting of arrays and objects in JSON bodies
    max_json_containers: int = DEFAULT_MAX_JSON_CONTAINERS  # arrays and objects in one JSON body
    max_header_line_bytes: int = DEFAULT_MAX_HEADER_LINE_BYTES  # HTTP request line and each header
    max_headers: int = DEFAULT_MAX_HEADERS  # HTTP header count
    max_grpc_metadata_bytes: int = DEFAULT_MAX_GRPC_METADATA_BYTES  # all metadata of a gRPC call
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT  # s: a new request's head must arrive within it
    body_timeout: float = DEFAULT_BODY_TIMEOUT  # s: a request body must arrive within it
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # per listener
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS  # per listener; more: overloaded
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES  # per worker: the memory budget; more: refused
    # Streams (gRPC ModelStreamInfer, docs/grpc.md#modelstreaminfer): open streams per listener, requests
    # of one stream in flight (more wait unread), responses waiting for a slow reader per stream.
    max_open_streams: int = DEFAULT_MAX_OPEN_STREAMS
    max_stream_requests: int = DEFAULT_MAX_STREAM_REQUESTS
    stream_buffer_responses: int = DEFAULT_STREAM_BUFFER_RESPONSES


def parse_limits(node: Node) -> Limits:
    def positive_duration(key: str, default: float) -> float:
        value = node.duration(key, default)
        if value == 0:
            node.error("must be more than 0", key)
        return float(value)

    limits = Limits(
        max_request_bytes=node.size("max_request_bytes", DEFAULT_MAX_REQUEST_BYTES),
        max_tensor_elements=node.integer("max_tensor_elements", 1 << 31, minimum=1),
        max_request_elements=node.integer("max_request_elements", DEFAULT_MAX_REQUEST_ELEMENTS, minimum=1),
        max_request_tensor_bytes=node.size("max_request_tensor_bytes", DEFAULT_MAX_REQUEST_TENSOR_BYTES),
        max_bytes_element=node.size("max_bytes_element", DEFAULT_MAX_BYTES_ELEMENT),
        max_json_depth=node.integer("max_json_depth", DEFAULT_MAX_JSON_DEPTH, minimum=2),
        max_json_containers=node.integer("max_json_containers", DEFAULT_MAX_JSON_CONTAINERS, minimum=16),
        max_header_line_bytes=node.size("max_header_line_bytes", DEFAULT_MAX_HEADER_LINE_BYTES),
        max_headers=node.integer("max_headers", DEFAULT_MAX_HEADERS, minimum=1),
        max_grpc_metadata_bytes=node.size("max_grpc_metadata_bytes", DEFAULT_MAX_GRPC_METADATA_BYTES),
        idle_timeout=positive_duration("idle_timeout", DEFAULT_IDLE_TIMEOUT),
        body_timeout=positive_duration("body_timeout", DEFAULT_BODY_TIMEOUT),
        max_connections=node.integer("max_connections", DEFAULT_MAX_CONNECTIONS, minimum=1),
        max_concurrent_requests=node.integer("max_concurrent_requests", DEFAULT_MAX_CONCURRENT_REQUESTS, minimum=1),
        max_inflight_bytes=node.size("max_inflight_bytes", DEFAULT_MAX_INFLIGHT_BYTES),
        max_open_streams=node.integer("max_open_streams", DEFAULT_MAX_OPEN_STREAMS, minimum=1),
        max_stream_requests=node.integer("max_stream_requests", DEFAULT_MAX_STREAM_REQUESTS, minimum=1),
        stream_buffer_responses=node.integer("stream_buffer_responses", DEFAULT_STREAM_BUFFER_RESPONSES,
                                             minimum=1),
    )
    if (isinstance(limits.max_inflight_bytes, int) and isinstance(limits.max_request_bytes, int)
            and limits.max_inflight_bytes < limits.max_request_bytes):
        node.error("must be at least limits.max_request_bytes (else the largest request never fits)",
                   "max_inflight_bytes")
    if isinstance(limits.max_json_depth, int) and limits.max_json_depth > MAX_JSON_DEPTH:
        node.error(f"must be at most {MAX_JSON_DEPTH} (deeper JSON cannot be written back)", "max_json_depth")
    if isinstance(limits.max_header_line_bytes, int) and limits.max_header_line_bytes < 256:
        node.error("must be at least 256", "max_header_line_bytes")
    node.check_no_unknown_keys()
    return limits
