"""The openai listener's mapping to V2 text models per route (presets,
field overrides, the chat template) and its request checks, without
sockets."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.config.node import ConfigError, Node
from gateway.core.types import InferRequest
from gateway.protocols.builtin.text import generate_text
from gateway.protocols.openai import codec, mapping
from gateway.protocols.openai.frontend import WordCount

LIMITS = codec.Limits(max_messages=4, max_tokens=50, default_max_tokens=10, max_embedding_inputs=3)
ASKED = {"model": "llm", "messages": [{"role": "system", "content": "short"},
                                      {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
         "max_tokens": 12, "temperature": 0.5, "top_p": 0.9, "stop": ["END"], "seed": 7, "stream": True}


def _options(options: dict[str, Any]) -> mapping.RouteOptions:
    problems: list[str] = []
    parsed = mapping.parse_route_options(Node(options, "options.openai", problems))
    if problems:
        raise ConfigError(problems)
    return parsed


def _request(options: dict[str, Any]) -> InferRequest:
    asked = codec.decode_chat(orjson.dumps(ASKED), LIMITS)
    route = _options(options)
    return mapping.text_request(asked, mapping.render_prompt(asked.messages or [], route), route, "id-1")


def _inputs(request: InferRequest) -> dict[str, tuple[str, tuple[int, ...], list[Any]]]:
    return {t.name: (t.datatype, t.shape, t.data.reshape(-1).tolist()) for t in request.inputs}


def test_the_default_preset_is_the_builtin_generators() -> None:
    request = _request({})
    assert _inputs(request) == {
        "text_input": ("BYTES", (1,), [b"system: short\nuser: hi\nassistant:"]),
        "max_tokens": ("INT32", (1,), [12]), "stream": ("BOOL", (1,), [True]), "stop": ("BYTES", (1,), [b"END"])}
    assert request.parameters == {"temperature": 0.5, "top_p": 0.9, "seed": 7}


def test_the_vllm_preset_fills_sampling_parameters() -> None:
    inputs = _inputs(_request({"preset": "vllm"}))
    assert set(inputs) == {"text_input", "stream", "sampling_parameters", "exclude_input_in_output"}
    assert orjson.loads(inputs["sampling_parameters"][2][0]) == {
        "max_tokens": 12, "temperature": 0.5, "top_p": 0.9, "stop": ["END"], "seed": 7}
    assert inputs["exclude_input_in_output"] == ("BOOL", (1,), [True])


def test_the_tensorrt_llm_preset_sends_batched_inputs() -> None:
    inputs = _inputs(_request({"preset": "tensorrt-llm"}))
    assert inputs["max_tokens"] == ("INT32", (1, 1), [12])
    assert inputs["stop_words"] == ("BYTES", (1, 1), [b"END"])
    assert inputs["random_seed"] == ("UINT64", (1, 1), [7])
    assert inputs["temperature"][0:2] == ("FP32", (1, 1))
    assert inputs["text_input"][1] == (1, 1)


def test_a_value_the_models_input_cannot_hold_is_the_clients_error() -> None:
    """A negative seed for TensorRT-LLM's UINT64 random_seed: OpenAI's
    invalid-request form naming the field, never a crash (found by fuzzing)."""
    asked = codec.decode_chat(orjson.dumps({**ASKED, "seed": -3}), LIMITS)
    route = _options({"preset": "tensorrt-llm"})
    with pytest.raises(codec.FieldError) as refused:
        mapping.text_request(asked, mapping.render_prompt(asked.messages or [], route), route, "id-1")
    assert refused.value.param == "seed" and refused.value.kind.name == "INVALID_INPUT"
    assert "random_seed (UINT64)" in refused.value.message


def test_fields_names_and_template_are_configurable() -> None:
    request = _request({"text_input": "prompt", "fields": {"seed": "none", "temperature": "input:temp:FP64",
                                                           "stop": "parameter:stop"},
                        "chat_template": {"message": "<{role}>{content}</{role}>", "generation_prompt": "<a>"}})
    inputs = _inputs(request)
    assert inputs["prompt"][2] == [b"<system>short</system><user>hi</user><a>"]
    assert inputs["temp"] == ("FP64", (1,), [0.5])
    assert request.parameters == {"top_p": 0.9, "stop": '["END"]'}


@pytest.mark.parametrize(("options", "words"), [
    ({"api": "images"}, "must be one of completions, chat, embeddings"),
    ({"preset": "tgi"}, "must be one of triton, vllm, tensorrt-llm"),
    ({"fields": {"logprobs": "none"}}, "unknown field"),
    ({"fields": {"seed": "header:x"}}, "must start with one of"),
    ({"fields": {"seed": "input:seed"}}, "needs a datatype"),
    ({"fields": {"seed": "json:seed"}}, "names none (json_input)"),
    ({"chat_template": {"mesage": "x"}}, "mesage"),
    ({"temperature": 1}, "temperature"),
])
def test_bad_route_options_are_refused(options: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as info:
        _options(options)
    assert words in str(info.value)


def test_defaults_and_unknown_fields() -> None:
    asked = codec.decode_completion(orjson.dumps({"model": "m", "prompt": ["p"], "logit_bias": {"1": 2},
                                                  "user": "u"}), LIMITS)
    assert (asked.prompt, asked.max_tokens, asked.stream, asked.stop) == ("p", LIMITS.default_max_tokens, False, [])
    asked = codec.decode_chat(orjson.dumps({**ASKED, "max_tokens": None, "max_completion_tokens": 20}), LIMITS)
    assert asked.max_tokens == 20


def test_upstream_errors_read_as_kinds() -> None:
    from gateway.protocols.openai import upstream_codec

    error = upstream_codec.decode_error(429, b'{"error": {"message": "slow down", "type": "rate_limit_error"}}',
                                        "llm")
    assert error.kind.name == "UPSTREAM_OVERLOADED" and "slow down" in error.message and "llm" in error.message
    assert upstream_codec.decode_error(500, b"not json", "llm").kind.name == "UPSTREAM_BAD_RESPONSE"


@pytest.mark.parametrize("pieces", [["ab", "c d", " e"], ["ab ", "", "  ", "cd e"], ["a", "b", "c d e "], ["abc d e"]])
def test_words_of_a_streamed_text_count_as_of_the_whole(pieces: list[str]) -> None:
    words = WordCount()
    for piece in pieces:
        words.add(piece)
    assert words.count == codec.count_tokens("".join(pieces)) == 3


def test_the_builtin_generator_stops_before_a_stop_string_across_tokens() -> None:
    whole = "".join(generate_text("p", 20, [], 0))
    stop = whole[8:14]  # spans a token boundary somewhere in the text
    cut = "".join(generate_text("p", 20, [stop], 0))
    # Cut where the stop starts, or after the token it starts in (a token once sent stays sent).
    assert whole.find(stop) <= len(cut) < whole.find(stop) + len(stop)
    assert stop not in cut and whole.startswith(cut)
