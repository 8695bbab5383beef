"""V2 gRPC to V2 gRPC without re-encoding: a client's ModelInferRequest goes
upstream as the bytes it sent, and the upstream's ModelInferResponse comes
back as the bytes the upstream sent.

Both messages are still decoded (zero-copy, see rawwire): the canonical
request is what validation, routing, statistics, mirrors and splits to
other protocols use; the decoded reply validates the upstream's answer and
lets output selection and classification work as on any other path. What
the pass-through saves is re-encoding — the copy of every tensor that
comes with it, and the loss or reordering of anything the gateway's
schema does not know (unknown fields, new parameter kinds).

Renaming without re-encoding: a protobuf parser keeps the *last* value of
a singular scalar field that occurs twice, so appending a ``model_name``
(field 1), ``model_version`` (2) or ``id`` (3) record to a serialized
message replaces that value. That is how a route's rewrite reaches the
upstream, and how the client gets back the model name it asked for (as on
the translating path). Appending copies the message once: Python bytes are
immutable, and grpc takes one bytes object per message.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.types import InferRequest, InferResponse, RawPayload, Tensor
from gateway.protocols.v2_grpc import rawwire

PROTOCOL = "v2-grpc"
CONTENT_TYPE = "application/grpc"
# The same numbers in ModelInferRequest and ModelInferResponse.
MODEL_NAME_FIELD, MODEL_VERSION_FIELD, ID_FIELD = 1, 2, 3


@dataclass(frozen=True, slots=True)
class GrpcPayload(RawPayload):
    """A serialized ModelInferRequest or ModelInferResponse, with the
    values its head carries (to tell whether a step changed them)."""

    model_name: str = ""
    model_version: str = ""
    id: str = ""
    # Replies only: the decoded outputs (a step that replaces or drops one
    # makes the bytes stale) and whether their data is raw_output_contents.
    outputs: tuple[Tensor, ...] = ()
    raw_outputs: bool = False


def request_payload(body: bytes, request: InferRequest) -> GrpcPayload:
    """The client's bytes, beside the request decoded from them."""
    return GrpcPayload(PROTOCOL, body, CONTENT_TYPE, model_name=request.model_name,
                       model_version=request.model_version, id=request.id)


def response_payload(body: bytes, response: InferResponse, raw_outputs: bool) -> GrpcPayload:
    """The upstream's bytes, beside the response decoded from them."""
    return GrpcPayload(PROTOCOL, body, CONTENT_TYPE, model_name=response.model_name,
                       model_version=response.model_version, id=response.id, outputs=tuple(response.outputs),
                       raw_outputs=raw_outputs)


def client_bytes(request: InferRequest) -> GrpcPayload | None:
    """The client's own message, if the request came from a V2 gRPC client
    and nothing since has dropped it (a step that changes more than the
    model name and version must set ``raw`` to None)."""
    raw = request.raw
    return raw if isinstance(raw, GrpcPayload) else None


def renamed(payload: GrpcPayload, model_name: str, model_version: str, message_id: str) -> bytes:
    """The payload's bytes, with fields appended for the values that differ."""
    suffix = b"".join(rawwire.string_field(number, new) for number, old, new in (
        (MODEL_NAME_FIELD, payload.model_name, model_name),
        (MODEL_VERSION_FIELD, payload.model_version, model_version),
        (ID_FIELD, payload.id, message_id)) if new != old)
    body = bytes(payload.body)  # gRPC messages arrive as bytes: the same object, not a copy
    return body + suffix if suffix else body


def upstream_bytes(payload: GrpcPayload, request: InferRequest) -> bytes:
    """What to send upstream for ``request`` (its model and version may have
    been rewritten by the route)."""
    return renamed(payload, request.model_name, request.model_version, request.id)


def reply_bytes(response: InferResponse, typed: bool) -> tuple[bytes, bool] | None:
    """The upstream's reply for the client, unchanged but for model name,
    version and id as the data plane set them, and whether any of those had
    to be appended; None when it must be
    re-encoded: no upstream bytes, outputs replaced or dropped on the way
    (output selection, classification), or contents in the other form than
    the listener answers with (``output_contents``)."""
    payload = response.raw
    if not isinstance(payload, GrpcPayload) or len(response.outputs) != len(payload.outputs):
        return None
    if payload.outputs and payload.raw_outputs == typed:
        return None
    if any(kept is not received for kept, received in zip(response.outputs, payload.outputs, strict=True)):
        return None
    body = renamed(payload, response.model_name, response.model_version, response.id)
    return body, body is not payload.body
