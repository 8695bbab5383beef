"""OpenAI requests <-> V2 text models, per route (``options.openai``),
in Triton's LLM conventions (docs/protocols.md, "OpenAI"):

- the prompt (chat messages rendered by the route's template) ->
  ``text_input`` BYTES; ``text_output`` BYTES -> the completion (its
  elements' text joined; in a stream each response carries new text);
- ``max_tokens``, ``stream``, ``temperature``, ``top_p``, ``stop``, ``seed``
  -> where the route's preset (or its ``fields``) puts each: a model input,
  a request parameter, a member of a JSON-string input (vLLM's
  ``sampling_parameters``), or nowhere;
- embeddings: the texts -> ``text_input`` BYTES [n]; ``embedding`` FP32
  [n, d] -> one vector per text.

Presets: ``triton`` (the builtin ``text_generator``'s: inputs text_input,
max_tokens, stream, stop; parameters temperature, top_p, seed), ``vllm``
(Triton's vLLM backend: text_input, stream, exclude_input_in_output, and
the rest in the ``sampling_parameters`` JSON input) and ``tensorrt-llm``
(the TensorRT-LLM backend's ensemble: every field an input, batched
``[1, 1]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import orjson

from gateway.config.node import Node
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.types import InferRequest, InferResponse, Tensor
from gateway.protocols.openai.codec import FieldError, Message, TextRequest

APIS = ("completions", "chat", "embeddings")
# Where a field goes: a model input, a request parameter, a member of the JSON input, or nowhere.
PLACES = ("input", "parameter", "json", "none")
FIELDS = ("max_tokens", "stream", "temperature", "top_p", "stop", "seed")
DATATYPES = ("BOOL", "INT32", "INT64", "UINT64", "FP32", "FP64", "BYTES")
DEFAULT_MESSAGE_TEMPLATE = "{role}: {content}\n"
DEFAULT_GENERATION_PROMPT = "assistant:"


@dataclass(frozen=True, slots=True)
class Target:
    place: str  # one of PLACES
    name: str = ""
    datatype: str = ""  # of an input


@dataclass(frozen=True, slots=True)
class Preset:
    fields: dict[str, Target]
    batched: bool = False  # inputs shaped [1, n] for a model with a batch dimension
    json_input: str = ""  # the JSON-string input "json" fields go into
    extra_inputs: tuple[tuple[str, str, Any], ...] = ()  # (name, datatype, value) sent always


PRESETS: dict[str, Preset] = {
    "triton": Preset({
        "max_tokens": Target("input", "max_tokens", "INT32"), "stream": Target("input", "stream", "BOOL"),
        "stop": Target("input", "stop", "BYTES"), "temperature": Target("parameter", "temperature"),
        "top_p": Target("parameter", "top_p"), "seed": Target("parameter", "seed")}),
    "vllm": Preset({
        "stream": Target("input", "stream", "BOOL"), "max_tokens": Target("json", "max_tokens"),
        "temperature": Target("json", "temperature"), "top_p": Target("json", "top_p"),
        "stop": Target("json", "stop"), "seed": Target("json", "seed")},
        json_input="sampling_parameters", extra_inputs=(("exclude_input_in_output", "BOOL", True),)),
    "tensorrt-llm": Preset({
        "max_tokens": Target("input", "max_tokens", "INT32"), "stream": Target("input", "stream", "BOOL"),
        "temperature": Target("input", "temperature", "FP32"), "top_p": Target("input", "top_p", "FP32"),
        "stop": Target("input", "stop_words", "BYTES"), "seed": Target("input", "random_seed", "UINT64")},
        batched=True),
}


@dataclass(frozen=True, slots=True)
class RouteOptions:
    """A route's ``options.openai``."""

    api: str = "completions"
    preset: Preset = PRESETS["triton"]
    text_input: str = "text_input"
    text_output: str = "text_output"
    embedding: str = "embedding"
    message_template: str = DEFAULT_MESSAGE_TEMPLATE
    generation_prompt: str = DEFAULT_GENERATION_PROMPT
    fields: dict[str, Target] = field(default_factory=dict)


DEFAULT_OPTIONS = RouteOptions()


def _target(node: Node, key: str) -> Target | None:
    """``place[:name[:DATATYPE]]``."""
    text = node.string(key)
    place, _, rest = text.partition(":")
    name, _, datatype = rest.partition(":")
    if place not in PLACES:
        node.error(f"must start with one of {', '.join(PLACES)}, got {text!r}", key)
        return None
    if place != "none" and not name:
        node.error(f"names no {place} (write '{place}:NAME')", key)
        return None
    if place == "input" and datatype not in DATATYPES:
        node.error(f"an input needs a datatype, one of {', '.join(DATATYPES)} (write 'input:NAME:DATATYPE')", key)
        return None
    return Target(place, name, datatype if place == "input" else "")


def parse_route_options(node: Node) -> RouteOptions:
    if node.value is None:
        return DEFAULT_OPTIONS
    preset = PRESETS[node.choice("preset", tuple(PRESETS), "triton")]
    fields = dict(preset.fields)
    overrides = node.child("fields", None)
    if overrides.value is not None:
        for key, _ in overrides.entries():
            if key not in FIELDS:
                overrides.error(f"unknown field; known: {', '.join(FIELDS)}", key)
                continue
            target = _target(overrides, key)
            if target is not None:
                fields[key] = target
    template = node.child("chat_template", None)
    message, generation = DEFAULT_MESSAGE_TEMPLATE, DEFAULT_GENERATION_PROMPT
    if template.value is not None:
        message = template.string("message", DEFAULT_MESSAGE_TEMPLATE)
        generation = template.string("generation_prompt", DEFAULT_GENERATION_PROMPT)
        template.check_no_unknown_keys()
    json_input = node.string("json_input", preset.json_input)
    if any(target.place == "json" for target in fields.values()) and not json_input:
        node.error("a field goes into the JSON input, but the route names none (json_input)")
    options = RouteOptions(node.choice("api", APIS, "completions"), replace(preset, json_input=json_input),
                           node.string("text_input", "text_input"), node.string("text_output", "text_output"),
                           node.string("embedding", "embedding"), message, generation, fields)
    node.check_no_unknown_keys()
    return options


def render_prompt(messages: list[Message], options: RouteOptions) -> str:
    """The chat messages as one prompt: each through the template (its
    ``{role}`` and ``{content}`` replaced), then the generation prompt."""
    template = options.message_template
    parts = [template.replace("{role}", message.role).replace("{content}", message.content) for message in messages]
    parts.append(options.generation_prompt)
    return "".join(parts)


def _tensor(name: str, datatype: str, values: list[Any], batched: bool) -> Tensor:
    array: np.ndarray = np.array([value.encode() if isinstance(value, str) else value for value in values],
                     dtype=object if datatype == "BYTES" else _NUMPY[datatype])
    if batched:
        array = array.reshape(1, -1)
    return Tensor(name, datatype, tuple(array.shape), array)


_NUMPY = {"BOOL": np.bool_, "INT32": np.int32, "INT64": np.int64, "UINT64": np.uint64, "FP32": np.float32,
          "FP64": np.float64}


def text_request(request: TextRequest, prompt: str, options: RouteOptions, request_id: str) -> InferRequest:
    """The V2 request for a chat or completion request."""
    preset = options.preset
    fields = options.fields or preset.fields
    inputs = [_tensor(options.text_input, "BYTES", [prompt], preset.batched)]
    parameters: dict[str, Any] = {}
    sampling: dict[str, Any] = {}
    values = {"max_tokens": request.max_tokens, "stream": request.stream, "temperature": request.temperature,
              "top_p": request.top_p, "stop": request.stop or None, "seed": request.seed}
    for name, value in values.items():
        target = fields.get(name)
        if value is None or target is None or target.place == "none":
            continue
        if target.place == "input":
            try:
                inputs.append(_tensor(target.name, target.datatype, value if isinstance(value, list) else [value],
                                      preset.batched))
            except (OverflowError, ValueError, TypeError):  # e.g. a negative seed for a UINT64 input
                raise FieldError(name, f"'{name}' does not fit the model's input {target.name} "
                                 f"({target.datatype})") from None
        elif target.place == "parameter":
            parameters[target.name] = orjson.dumps(value).decode() if isinstance(value, list) else value
        else:
            sampling[target.name] = value
    if sampling:
        inputs.append(_tensor(preset.json_input, "BYTES", [orjson.dumps(sampling).decode()], preset.batched))
    inputs.extend(_tensor(name, datatype, [value], preset.batched) for name, datatype, value in preset.extra_inputs)
    return InferRequest(request.model, "", request_id, inputs, parameters=parameters)


def _output(response: InferResponse, name: str) -> Tensor:
    for tensor in response.outputs:
        if tensor.name == name:
            return tensor
    names = ", ".join(f"'{tensor.name}'" for tensor in response.outputs[:10])
    raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                       f"model '{response.model_name}' answered no output '{name}' (it answered {names or 'none'}); "
                       "the route's options.openai names the outputs")


def text_of(response: InferResponse, options: RouteOptions) -> str:
    """The text a response carries (its ``text_output`` elements joined)."""
    tensor = _output(response, options.text_output)
    if tensor.datatype != "BYTES":
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                           f"output '{tensor.name}' of model '{response.model_name}' is {tensor.datatype}, not BYTES")
    return "".join(item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
                   for item in tensor.data.reshape(-1))


def carries_text(response: InferResponse, options: RouteOptions) -> bool:
    """Whether a streamed response has text (a decoupled model may end with an empty response)."""
    return any(tensor.name == options.text_output for tensor in response.outputs)


def reported_tokens(response: InferResponse) -> tuple[int | None, int | None]:
    """The prompt and completion token counts the model reported in its
    answer's parameters (an ``openai`` upstream relays the server's
    ``usage`` so), None where it reported none."""
    parameters = response.parameters
    if not parameters:
        return None, None
    prompt, completion = parameters.get("prompt_tokens"), parameters.get("completion_tokens")
    return (prompt if type(prompt) is int else None), (completion if type(completion) is int else None)


def embeddings_request(model: str, texts: list[str], options: RouteOptions, request_id: str) -> InferRequest:
    return InferRequest(model, "", request_id, [_tensor(options.text_input, "BYTES", list(texts), False)])


def vectors_of(response: InferResponse, options: RouteOptions, count: int) -> np.ndarray:
    """The FP32 [n, d] embedding output, one row per text."""
    tensor = _output(response, options.embedding)
    data = tensor.data
    if tensor.datatype not in ("FP32", "FP64", "FP16") or data.ndim != 2 or data.shape[0] != count:
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                           f"output '{tensor.name}' of model '{response.model_name}' must be FP32 [{count}, d], "
                           f"got {tensor.datatype} {list(data.shape)}")
    return data.astype(np.float32, copy=False)
