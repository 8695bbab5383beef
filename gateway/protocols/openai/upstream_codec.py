"""The ``openai`` upstream's codec: a V2 request for a text model in
Triton's LLM conventions as an OpenAI API request, and the server's
answers (whole, streamed chunks, embeddings, errors) as V2 responses.
Pure functions, no sockets (docs/protocols.md, "The openai upstream").

V2 side: ``text_input`` BYTES (one element; for embeddings, n) and the
sampling fields below, each an input of one element or a request
parameter (an input wins); ``text_output`` BYTES [1] or ``embedding``
FP32 [n, d] back. ``stream`` is read from the call: a stream's request is
streamed upstream unless it says ``stream: false``. Triton's vLLM model
takes the sampling fields as one JSON text, ``sampling_parameters``, and
TensorRT-LLM names two of them otherwise (:data:`ALIASES`): both are read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson

from gateway.core.addresses import without_addresses
from gateway.core.errors import ErrorKind, GatewayError, invalid
from gateway.core.types import InferRequest, InferResponse, ModelMetadata, Tensor, TensorSpec
from gateway.protocols.openai.errors import kind_of_upstream_status
from gateway.protocols.openai.upstream_options import CHAT, EMBEDDINGS

JSON_TYPE = "application/json"
TEXT_INPUT, TEXT_OUTPUT, EMBEDDING_OUTPUT, STREAM_INPUT = "text_input", "text_output", "embedding", "stream"
DONE = b"[DONE]"  # the data of a stream's last event
PLATFORM = "openai"

# The sampling fields a text request carries: V2 name (= OpenAI name) -> V2 datatype.
SAMPLING: dict[str, str] = {
    "max_tokens": "INT32", "temperature": "FP32", "top_p": "FP32", "seed": "INT64",
    "presence_penalty": "FP32", "frequency_penalty": "FP32", "stop": "BYTES",
}
# TensorRT-LLM's names for two of them, read when the OpenAI name is absent.
ALIASES: dict[str, tuple[str, ...]] = {"stop": ("stop_words",), "seed": ("random_seed",)}
# Triton's vLLM model: the sampling fields as one JSON object in a BYTES input (or a parameter).
SAMPLING_PARAMETERS = "sampling_parameters"
_MAX_STOP_SEQUENCES = 4  # OpenAI's bound
_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")


def path_of(api: str) -> str:
    return {CHAT: "/v1/chat/completions", EMBEDDINGS: "/v1/embeddings"}.get(api, "/v1/completions")


def model_metadata(model: str, api: str) -> ModelMetadata:
    """What a text model of ``api`` looks like to a V2 client."""
    if api == EMBEDDINGS:
        return ModelMetadata(model, (), PLATFORM, (TensorSpec(TEXT_INPUT, "BYTES", (-1,)),),
                             (TensorSpec(EMBEDDING_OUTPUT, "FP32", (-1, -1)),))
    inputs = (TensorSpec(TEXT_INPUT, "BYTES", (1,)), TensorSpec(STREAM_INPUT, "BOOL", (1,)),
              TensorSpec(SAMPLING_PARAMETERS, "BYTES", (1,)),
              *(TensorSpec(name, datatype, (-1,) if name == "stop" else (1,)) for name, datatype in SAMPLING.items()))
    return ModelMetadata(model, (), PLATFORM, inputs, (TensorSpec(TEXT_OUTPUT, "BYTES", (1,)),))


# --- requests ------------------------------------------------------------------


def _input(request: InferRequest, name: str) -> Tensor | None:
    for tensor in request.inputs:
        if tensor.name == name:
            return tensor
    return None


def _text(value: Any, where: str) -> str:
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise invalid(f"{where} is not UTF-8 text") from None
    if isinstance(value, str):
        return value
    raise invalid(f"{where} must be text (BYTES)")


def texts(request: InferRequest) -> list[str]:
    """Every element of ``text_input``, as text."""
    tensor = _input(request, TEXT_INPUT)
    if tensor is None:
        raise invalid(f"model '{request.model_name}' takes its text as input '{TEXT_INPUT}' (BYTES)")
    if tensor.datatype != "BYTES":
        raise invalid(f"input '{TEXT_INPUT}' must be BYTES, got {tensor.datatype}")
    return [_text(item, f"input '{TEXT_INPUT}'") for item in tensor.data.reshape(-1)]


def _field(request: InferRequest, name: str) -> Any:
    """A sampling field's value: from an input of that name (or an alias),
    else a request parameter; None when the request has neither."""
    for candidate in (name, *ALIASES.get(name, ())):
        tensor = _input(request, candidate)
        if tensor is not None:
            return _tensor_value(tensor, name)
        if candidate in request.parameters:
            return request.parameters[candidate]
    return None


def _tensor_value(tensor: Tensor, name: str) -> Any:
    values = [item.item() if hasattr(item, "item") else item for item in tensor.data.reshape(-1)]
    if name == "stop":
        return values
    if len(values) != 1:
        raise invalid(f"input '{tensor.name}' must hold one value, got {len(values)}")
    return values[0]


def _sampling_parameters(request: InferRequest) -> dict[str, Any]:
    """``sampling_parameters``, a JSON object as text, or nothing."""
    text = _field(request, SAMPLING_PARAMETERS)
    if text is None:
        return {}
    try:
        obj = orjson.loads(_text(text, f"'{SAMPLING_PARAMETERS}'"))
    except orjson.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict):
        raise invalid(f"'{SAMPLING_PARAMETERS}' must be a JSON object as text")
    return obj


def _sampling(request: InferRequest) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    bundled = _sampling_parameters(request)
    for name in SAMPLING:
        value = _field(request, name)
        if value is None:
            value = bundled.get(name)
        if value is None:
            continue
        if name == "stop":
            stops = [value] if isinstance(value, str | bytes) else value
            if not isinstance(stops, list) or not 0 < len(stops) <= _MAX_STOP_SEQUENCES:
                raise invalid(f"'stop' must be 1 to {_MAX_STOP_SEQUENCES} strings")
            fields[name] = [_text(stop, "'stop'") for stop in stops]
        elif name in ("max_tokens", "seed"):
            if isinstance(value, bool) or not isinstance(value, int) or (name == "max_tokens" and value < 1):
                raise invalid(f"'{name}' must be an integer" + (" >= 1" if name == "max_tokens" else ""))
            fields[name] = value
        else:
            if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
                raise invalid(f"'{name}' must be a number")
            fields[name] = float(value)
    return fields


def wants_stream(request: InferRequest) -> bool:
    """Whether a stream's request asks for chunks (``stream`` absent: yes)."""
    value = _field(request, STREAM_INPUT)
    if value is None:
        return True
    if not isinstance(value, bool):
        raise invalid(f"'{STREAM_INPUT}' must be a boolean")
    return value


def encode_text_request(request: InferRequest, api: str, stream: bool) -> bytes:
    """A completions or chat request: the one ``text_input`` as the prompt
    or a user message, the sampling fields as they are named."""
    prompt = texts(request)
    if len(prompt) != 1:
        raise invalid(f"input '{TEXT_INPUT}' must hold one text for a {api} model, got {len(prompt)}")
    body: dict[str, Any] = {"model": request.model_name}
    if api == CHAT:
        body["messages"] = [{"role": "user", "content": prompt[0]}]
    else:
        body["prompt"] = prompt[0]
    body.update(_sampling(request))
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


def encode_embeddings_request(request: InferRequest) -> tuple[bytes, int]:
    """An embeddings request for every text of ``text_input``, and their count."""
    inputs = texts(request)
    if not inputs:
        raise invalid(f"input '{TEXT_INPUT}' holds no text")
    return orjson.dumps({"model": request.model_name, "input": inputs}), len(inputs)


# --- answers -------------------------------------------------------------------


def _object(data: bytes | bytearray, what: str) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"{what} is not JSON") from None
    if not isinstance(obj, dict):
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"{what} is not a JSON object")
    return obj


def _choice_text(obj: dict[str, Any], api: str, part: str, what: str) -> str | None:
    """The first choice's text (``part``: ``message`` or ``delta`` for chat);
    None when the object has no choice (a usage-only chunk)."""
    choices = obj.get("choices")
    if not isinstance(choices, list):
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"{what} has no 'choices' list")
    if not choices:
        return None
    choice = choices[0]
    if not isinstance(choice, dict):
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"{what}: a choice is not an object")
    if api == CHAT:
        message = choice.get(part)
        text = message.get("content") if isinstance(message, dict) else None
    else:
        text = choice.get("text")
    if text is None:
        return ""
    if not isinstance(text, str):
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"{what}: the choice's text is not a string")
    return text


def usage_parameters(obj: dict[str, Any]) -> dict[str, int]:
    """The answer's token counts, as the upstream reported them."""
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return {}
    return {name: value for name in _USAGE_FIELDS
            if isinstance(value := usage.get(name), int) and not isinstance(value, bool)}


def text_response(request: InferRequest, text: str, parameters: dict[str, Any] | None = None) -> InferResponse:
    data = np.empty(1, dtype=object)
    data[0] = text.encode("utf-8")
    return InferResponse(request.model_name, request.model_version, request.id,
                         [Tensor(TEXT_OUTPUT, "BYTES", (1,), data)], dict(parameters or {}))


def decode_text_answer(data: bytes | bytearray, api: str) -> tuple[str, dict[str, int]]:
    """A whole completion's text and usage."""
    obj = _object(data, "the completion")
    return _choice_text(obj, api, "message", "the completion") or "", usage_parameters(obj)


def decode_chunk(data: bytes, api: str) -> str | None:
    """One streamed chunk's new text; None for a chunk without a choice.
    An error object mid-stream raises its message."""
    obj = _object(data, "a streamed chunk")
    error = obj.get("error")
    if error is not None:
        message = error.get("message") if isinstance(error, dict) else error
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"sent an error in its stream: {str(message)[:512]}")
    return _choice_text(obj, api, "delta", "a streamed chunk")


def decode_embeddings(data: bytes | bytearray, count: int, max_elements: int) -> tuple[np.ndarray, dict[str, int]]:
    """``data[i].embedding`` (by ``index``) as FP32 [count, d], and the usage."""
    obj = _object(data, "the embeddings answer")
    items = obj.get("data")
    if not isinstance(items, list) or len(items) != count:
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"the embeddings answer does not hold {count} embeddings")
    rows: list[Any] = [None] * count
    for position, item in enumerate(items):
        index = item.get("index", position) if isinstance(item, dict) else None
        vector = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(index, int) or not 0 <= index < count or rows[index] is not None:
            raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, "the embeddings answer has a bad or repeated index")
        if not isinstance(vector, list) or not vector:
            raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                               "the embeddings answer has an embedding that is not a list of numbers "
                               "(encoding_format base64 is not asked for)")
        rows[index] = vector
    width = len(rows[0])
    if any(len(row) != width for row in rows) or count * width > max_elements:
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                           f"the embeddings differ in length or exceed {max_elements} elements")
    try:
        return np.array(rows, dtype=np.float32), usage_parameters(obj)
    except (TypeError, ValueError):
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, "the embeddings answer holds a value that is no number") \
            from None


def embeddings_response(request: InferRequest, matrix: np.ndarray, parameters: dict[str, Any]) -> InferResponse:
    return InferResponse(request.model_name, request.model_version, request.id,
                         [Tensor(EMBEDDING_OUTPUT, "FP32", tuple(int(d) for d in matrix.shape), matrix)],
                         parameters)


# --- errors --------------------------------------------------------------------


def _redacted(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return text


def decode_error(status: int, body: bytes | bytearray, upstream: str, secrets: Iterable[str] = ()) -> GatewayError:
    """An OpenAI error answer (``{"error": {"message", "type", ...}}``) as a
    gateway error by its status. A refused credential's words are dropped
    (servers quote part of the key); other words lose addresses and any
    secret of the gateway's."""
    detail = f"upstream '{upstream}' answered {status}"
    if status in (401, 403):
        return GatewayError(kind_of_upstream_status(status), detail + ": it refused the gateway's API key")
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None
    error = obj.get("error") if isinstance(obj, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    if isinstance(message, str) and message:
        detail += ": " + without_addresses(_redacted(message[:512], secrets))
    return GatewayError(kind_of_upstream_status(status), detail)
