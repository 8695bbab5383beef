"""V2 gRPC's error table, both directions: the status code the frontend
answers for each kind, and what an upstream's code means (never passed
through blindly). The codec adds the transport failures grpc hides in
UNAVAILABLE (codec.transport_failure)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import grpc

from gateway.core.errors import ErrorKind, ErrorTable

CODE_OF_KIND: Mapping[ErrorKind, grpc.StatusCode] = MappingProxyType({
    ErrorKind.MALFORMED_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.INVALID_INPUT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.MODEL_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorKind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorKind.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.UPSTREAM_OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.NOT_READY: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.UPSTREAM_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.UPSTREAM_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorKind.UPSTREAM_BAD_RESPONSE: grpc.StatusCode.INTERNAL,
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
})

# Every code an upstream can answer, as a kind.
KIND_OF_UPSTREAM_CODE: Mapping[grpc.StatusCode, ErrorKind] = MappingProxyType({
    grpc.StatusCode.CANCELLED: ErrorKind.UPSTREAM_BAD_RESPONSE,  # the upstream gave up on the call
    grpc.StatusCode.UNKNOWN: ErrorKind.UPSTREAM_BAD_RESPONSE,
    grpc.StatusCode.INVALID_ARGUMENT: ErrorKind.INVALID_INPUT,
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorKind.UPSTREAM_TIMEOUT,
    grpc.StatusCode.NOT_FOUND: ErrorKind.MODEL_NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS: ErrorKind.UPSTREAM_BAD_RESPONSE,
    grpc.StatusCode.PERMISSION_DENIED: ErrorKind.UNAUTHENTICATED,  # forwarded credentials may be the client's
    grpc.StatusCode.RESOURCE_EXHAUSTED: ErrorKind.UPSTREAM_OVERLOADED,  # TOO_LARGE when it says so (below)
    grpc.StatusCode.FAILED_PRECONDITION: ErrorKind.NOT_READY,
    grpc.StatusCode.ABORTED: ErrorKind.UPSTREAM_BAD_RESPONSE,
    grpc.StatusCode.OUT_OF_RANGE: ErrorKind.INVALID_INPUT,
    grpc.StatusCode.UNIMPLEMENTED: ErrorKind.UNSUPPORTED,
    grpc.StatusCode.INTERNAL: ErrorKind.UPSTREAM_BAD_RESPONSE,  # its bug, to the gateway a bad answer
    grpc.StatusCode.UNAVAILABLE: ErrorKind.UPSTREAM_UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS: ErrorKind.UPSTREAM_BAD_RESPONSE,
    grpc.StatusCode.UNAUTHENTICATED: ErrorKind.UNAUTHENTICATED,  # (docs/security.md)
})


def kind_of_upstream_code(code: grpc.StatusCode, details: str | None = None) -> ErrorKind:
    """An upstream's code as a kind; its details refine two codes."""
    if code is grpc.StatusCode.UNKNOWN and "ModelNotFound" in (details or ""):
        return ErrorKind.MODEL_NOT_FOUND  # MLServer 1.7's ModelReady/ModelMetadata leave this unmapped
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than" in (details or ""):
        return ErrorKind.TOO_LARGE  # grpc's own "Received message larger than max": the request, not a load
    return KIND_OF_UPSTREAM_CODE.get(code, ErrorKind.UPSTREAM_BAD_RESPONSE)


ERRORS = ErrorTable(CODE_OF_KIND, kind_of_upstream_code,
                    frozenset(code for code in grpc.StatusCode if code is not grpc.StatusCode.OK))
