"""Reading an upstream's ModelStreamInfer, in either message form.

Servers disagree on what the RPC streams back (docs/grpc.md#modelstreaminfer):

- **triton**: ``ModelStreamInferResponse {error_message = 1, infer_response
  = 2}``; a response's parameter ``triton_final_response`` says whether it
  is the request's last; an error for the request comes as
  ``error_message``.
- **mlserver** (MLServer 1.7): plain ``ModelInferResponse``; there is no
  final flag (the stream's end says it) and an error ends the call with a
  status.

``auto`` asks the server's metadata once: a server named ``mlserver`` gets
MLServer's form, any other Triton's (Triton, KServe, this gateway).
"""

from __future__ import annotations

import grpc
from google.protobuf.message import DecodeError

from gateway.core.contracts import StreamedResponse
from gateway.core.errors import GatewayError, malformed
from gateway.protocols.v2_grpc import codec, rawwire
from gateway.protocols.v2_grpc import messages as pb
from gateway.protocols.v2_grpc.errors import kind_of_upstream_code
from gateway.protocols.v2_grpc.stream import FINAL_PARAMETER, INFER_RESPONSE_FIELD
from gateway.transport.upstream import reading_reply

TRITON, MLSERVER, AUTO = "triton", "mlserver", "auto"
FORMS = (AUTO, TRITON, MLSERVER)


def form_of_server(name: str) -> str:
    """The stream form of a server that calls itself ``name`` (ServerMetadata)."""
    return MLSERVER if name.strip().lower() == "mlserver" else TRITON


def stream_part(data: bytes, form: str, upstream: str, max_elements: int) -> StreamedResponse:
    """One message of the upstream's stream as a response; an error the
    upstream sent for the request (Triton's form) raises it."""
    with reading_reply(upstream):
        if form == MLSERVER:
            response, _ = codec.decode_infer_response_form(data, max_elements)
            return StreamedResponse(response, final=False)
        head, entries = rawwire.split(data, INFER_RESPONSE_FIELD)
        try:
            error = pb.ModelStreamInferResponse.FromString(head).error_message if head else ""
        except DecodeError:
            raise malformed("not a valid inference.ModelStreamInferResponse message") from None
        if error:
            # Triton's words carry no status code: the table's UNKNOWN row, refined by the words.
            raise GatewayError(kind_of_upstream_code(grpc.StatusCode.UNKNOWN, error),
                               f"upstream {upstream} answered with an error: {error[:512]}")
        # Repeated occurrences of a message field merge: their bytes joined are the message.
        inner = entries[0] if len(entries) == 1 else b"".join(entries)
        response, _ = codec.decode_infer_response_form(inner, max_elements)
    final = bool(response.parameters.pop(FINAL_PARAMETER, False))
    return StreamedResponse(response, final=final)
