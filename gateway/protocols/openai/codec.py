"""OpenAI's API for clients: requests decoded and checked, answers and
stream chunks encoded (plain functions, no server imports). Fields the
gateway does not use are ignored, as OpenAI's servers do; a field of the
wrong type, a missing ``model``/``messages``/``prompt``/``input``, or a
value past the listener's limits is an ``invalid_request_error`` naming the
field in ``param``. The mapping to V2 tensors is mapping.py."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from gateway.core.errors import ErrorKind, GatewayError
from gateway.protocols.openai.errors import CODE_OF_KIND, STATUS_OF_KIND, TYPE_OF_STATUS

PROTOCOL = "openai"
JSON_TYPE = "application/json"
DONE_EVENT = b"data: [DONE]\n\n"
# OpenAI takes at most this many stop sequences.
MAX_STOPS = 4


class FieldError(GatewayError):
    """A request field OpenAI's form names in ``param``."""

    def __init__(self, param: str, message: str, kind: ErrorKind = ErrorKind.INVALID_INPUT) -> None:
        super().__init__(kind, message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Limits:
    """The listener's bounds on one request (its options, frontend.py)."""

    max_messages: int
    max_tokens: int
    default_max_tokens: int
    max_embedding_inputs: int


@dataclass(slots=True)
class Message:
    role: str
    content: str


@dataclass(slots=True)
class TextRequest:
    """A chat or completion request: ``messages`` (chat) or ``prompt``."""

    model: str
    messages: list[Message] | None
    prompt: str
    max_tokens: int
    stream: bool = False
    include_usage: bool = False
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


@dataclass(slots=True)
class EmbeddingRequest:
    model: str
    texts: list[str]
    base64: bool = False
    dimensions: int | None = None


# --- requests ------------------------------------------------------------------


def _object(body: bytes | bytearray) -> dict[str, Any]:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise FieldError("", f"the request body is not valid JSON: {exc}", ErrorKind.MALFORMED_REQUEST) from None
    if not isinstance(obj, dict):
        raise FieldError("", "the request body must be a JSON object", ErrorKind.MALFORMED_REQUEST)
    return obj


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _model(obj: dict[str, Any]) -> str:
    model = obj.get("model")
    if model is None:
        raise FieldError("model", "you must provide a model parameter")
    if not isinstance(model, str) or not model:
        raise FieldError("model", f"'model' must be a non-empty string, got {_type_name(model)}")
    return model


def _optional_number(obj: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = obj.get(name)
    if value is None:
        return None
    if type(value) not in (int, float):
        raise FieldError(name, f"'{name}' must be a number, got {_type_name(value)}")
    if not low <= value <= high:
        raise FieldError(name, f"'{name}' must be between {low:g} and {high:g}, got {value}")
    return float(value)


def _optional_int(obj: dict[str, Any], name: str) -> int | None:
    value = obj.get(name)
    if value is None:
        return None
    if type(value) is not int:
        raise FieldError(name, f"'{name}' must be an integer, got {_type_name(value)}")
    return value


def _flag(obj: dict[str, Any], name: str) -> bool:
    value = obj.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise FieldError(name, f"'{name}' must be a boolean, got {_type_name(value)}")
    return value


def _max_tokens(obj: dict[str, Any], limits: Limits) -> int:
    name = "max_completion_tokens" if obj.get("max_completion_tokens") is not None else "max_tokens"
    value = _optional_int(obj, name)
    if value is None:
        return limits.default_max_tokens
    if not 1 <= value <= limits.max_tokens:
        raise FieldError(name, f"'{name}' must be between 1 and {limits.max_tokens} (the listener's "
                         f"max_tokens), got {value}")
    return value


def _stop(obj: dict[str, Any]) -> list[str]:
    value = obj.get("stop")
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops):
        raise FieldError("stop", "'stop' must be a string or an array of strings")
    if len(stops) > MAX_STOPS:
        raise FieldError("stop", f"'stop' takes at most {MAX_STOPS} sequences, got {len(stops)}")
    return [stop for stop in stops if stop]


def _sampling(obj: dict[str, Any], model: str, limits: Limits) -> dict[str, Any]:
    n = _optional_int(obj, "n")
    if n is not None and n != 1:
        raise FieldError("n", f"only n=1 is supported, got {n}")
    options = obj.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise FieldError("stream_options", f"'stream_options' must be an object, got {_type_name(options)}")
    return {"model": model, "max_tokens": _max_tokens(obj, limits), "stream": _flag(obj, "stream"),
            "include_usage": _flag(options, "include_usage") if options else False,
            "temperature": _optional_number(obj, "temperature", 0, 2),
            "top_p": _optional_number(obj, "top_p", 0, 1), "stop": _stop(obj), "seed": _optional_int(obj, "seed")}


def _content(value: Any, where: str) -> str:
    """A message's content: a string, null, or an array of text parts."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, list):
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise FieldError(where, f"'{where}' parts must be objects {{\"type\": \"text\", \"text\": "
                                 "string}: only text is supported")
            texts.append(part["text"])
        return "".join(texts)
    raise FieldError(where, f"'{where}' must be a string or an array of text parts, got {_type_name(value)}")


def decode_chat(body: bytes | bytearray, limits: Limits) -> TextRequest:
    obj = _object(body)
    model = _model(obj)
    messages = obj.get("messages")
    if messages is None:
        raise FieldError("messages", "you must provide a messages parameter")
    if not isinstance(messages, list) or not messages:
        raise FieldError("messages", "'messages' must be a non-empty array of messages")
    if len(messages) > limits.max_messages:
        raise FieldError("messages", f"'messages' has {len(messages)} messages, over the listener's limit of "
                         f"{limits.max_messages} (max_messages)")
    decoded = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise FieldError(where, f"'{where}' must be an object, got {_type_name(message)}")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise FieldError(f"{where}.role", f"'{where}.role' must be a non-empty string")
        decoded.append(Message(role, _content(message.get("content"), f"{where}.content")))
    return TextRequest(messages=decoded, prompt="", **_sampling(obj, model, limits))


def decode_completion(body: bytes | bytearray, limits: Limits) -> TextRequest:
    obj = _object(body)
    model = _model(obj)
    prompt = obj.get("prompt")
    if prompt is None:
        raise FieldError("prompt", "you must provide a prompt parameter")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise FieldError("prompt", "'prompt' must be a string (or an array of one string): one prompt per request")
    return TextRequest(messages=None, prompt=prompt, **_sampling(obj, model, limits))


def decode_embeddings(body: bytes | bytearray, limits: Limits) -> EmbeddingRequest:
    obj = _object(body)
    model = _model(obj)
    value = obj.get("input")
    if value is None:
        raise FieldError("input", "you must provide an input parameter")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(text, str) for text in texts):
        raise FieldError("input", "'input' must be a string or a non-empty array of strings")
    if len(texts) > limits.max_embedding_inputs:
        raise FieldError("input", f"'input' has {len(texts)} texts, over the listener's limit of "
                         f"{limits.max_embedding_inputs} (max_embedding_inputs)")
    encoding = obj.get("encoding_format")
    if encoding not in (None, "float", "base64"):
        raise FieldError("encoding_format", "'encoding_format' must be 'float' or 'base64'")
    dimensions = _optional_int(obj, "dimensions")
    if dimensions is not None and dimensions < 1:
        raise FieldError("dimensions", f"'dimensions' must be at least 1, got {dimensions}")
    return EmbeddingRequest(model, texts, encoding == "base64", dimensions)


# --- answers -------------------------------------------------------------------


def count_tokens(text: str) -> int:
    """What ``usage`` counts when the model does not say: whitespace-separated words."""
    return len(text.split())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def encode_text_answer(request: TextRequest, answer_id: str, created: int, text: str, finish_reason: str,
                       prompt_tokens: int, completion_tokens: int | None = None) -> bytes:
    """``completion_tokens`` None: counted here (count_tokens)."""
    if request.messages is not None:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": finish_reason}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    return orjson.dumps({"id": answer_id, "object": kind, "created": created, "model": request.model,
                         "choices": [choice],
                         "usage": usage(prompt_tokens, count_tokens(text) if completion_tokens is None
                                        else completion_tokens)})


def encode_chunk(request: TextRequest, answer_id: str, created: int, text: str | None,
                 finish_reason: str | None, first: bool = False) -> bytes:
    """One stream chunk as an SSE event: new text, or (``text`` None) the
    end with its finish reason."""
    if request.messages is not None:
        delta: dict[str, Any] = {} if text is None else {"content": text}
        if first:
            delta["role"] = "assistant"
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    chunk = orjson.dumps({"id": answer_id, "object": kind, "created": created, "model": request.model,
                          "choices": [choice]})
    return b"data: " + chunk + b"\n\n"


def encode_usage_chunk(request: TextRequest, answer_id: str, created: int, prompt_tokens: int,
                       completion_tokens: int) -> bytes:
    """The last chunk of a stream that asked for ``stream_options.include_usage``."""
    kind = "chat.completion.chunk" if request.messages is not None else "text_completion"
    chunk = orjson.dumps({"id": answer_id, "object": kind, "created": created, "model": request.model,
                          "choices": [], "usage": usage(prompt_tokens, completion_tokens)})
    return b"data: " + chunk + b"\n\n"


def encode_embeddings(request: EmbeddingRequest, vectors: np.ndarray, prompt_tokens: int | None = None) -> bytes:
    """``vectors`` FP32 [n, d], one row per text; ``prompt_tokens`` None: counted here."""
    rows = np.ascontiguousarray(vectors, dtype="<f4")
    data = [{"object": "embedding", "index": index,
             "embedding": base64.b64encode(row.tobytes()).decode() if request.base64 else row.tolist()}
            for index, row in enumerate(rows)]
    if prompt_tokens is None:
        prompt_tokens = sum(count_tokens(text) for text in request.texts)
    return orjson.dumps({"object": "list", "data": data, "model": request.model,
                         "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}})


def model_entry(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "gateway"}


def encode_models(names: list[str]) -> bytes:
    return orjson.dumps({"object": "list", "data": [model_entry(name) for name in names]})


def encode_model(name: str) -> bytes:
    return orjson.dumps(model_entry(name))


def error_body(error: GatewayError, status: int) -> bytes:
    kind = TYPE_OF_STATUS.get(status, "invalid_request_error" if status < 500 else "server_error")
    return orjson.dumps({"error": {"message": error.message, "type": kind,
                                   "param": getattr(error, "param", None) or None,
                                   "code": CODE_OF_KIND.get(error.kind)}})


def encode_error(error: GatewayError) -> tuple[int, bytes]:
    """OpenAI's error object and the kind's HTTP status (errors.py)."""
    status = STATUS_OF_KIND[error.kind]
    return status, error_body(error, status)


def encode_stream_error(error: GatewayError) -> bytes:
    """An error after a stream's first chunk: an event holding the error object."""
    return b"data: " + error_body(error, STATUS_OF_KIND[error.kind]) + b"\n\n"
