"""The ``openai`` listener with the ``openai`` SDK (sync and async,
streaming and not; chat, completions, embeddings, models) over real
sockets: to the builtin text models in-process, and through a V2 REST
(``generate_stream``) and a V2 gRPC (``ModelStreamInfer``) upstream to a
second gateway serving them. Every path gives the same answers; the text
honours ``max_tokens`` and ``stop``; errors come in OpenAI's form."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import numpy as np
import openai
import pytest
import requests

from gateway.config.node import ConfigError
from support import GatewayProcess, parse_yaml_config, write_config

BACK = """
admin: {address: null}
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
  - {name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}
upstreams:
  - {name: local, protocol: builtin}
routes:
  - match: {model: "*"}
    upstream: local
"""

# One openai listener per path to the models; routes pick the upstream by listener.
FRONT = """
admin: {{address: null}}
listeners:
  - {{name: direct, protocol: openai, address: "127.0.0.1:0", max_tokens: 100}}
  - {{name: via-rest, protocol: openai, address: "127.0.0.1:0", max_tokens: 100}}
  - {{name: via-grpc, protocol: openai, address: "127.0.0.1:0", max_tokens: 100}}
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin}}
  - {{name: back-rest, protocol: v2-rest, endpoints: ["{rest}"], streaming: generate_stream}}
  - {{name: back-grpc, protocol: v2-grpc, endpoints: ["{grpc}"]}}
routes:
  - match: {{listener: via-rest}}
    upstream: back-rest
  - match: {{listener: via-grpc}}
    upstream: back-grpc
  - match: {{model: "*"}}
    upstream: local
"""
PATHS = ("direct", "via-rest", "via-grpc")
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story"}]


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("openai")
    with GatewayProcess(write_config(directory, BACK, "back.yaml"), directory / "back.log") as back:
        front_config = FRONT.format(rest=back.url("rest"), grpc=back.url("grpc"))
        with GatewayProcess(write_config(directory, front_config, "front.yaml"), directory / "front.log") as front:
            yield front
            assert "Traceback" not in front.log()
        assert "Traceback" not in back.log()


def client(gw: GatewayProcess, listener: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{gw.url(listener)}/v1", api_key="unused", max_retries=0, timeout=20)


def async_client(gw: GatewayProcess, listener: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://{gw.url(listener)}/v1", api_key="unused", max_retries=0,
                              timeout=20)


def _sync_answers(gw: GatewayProcess, listener: str) -> dict[str, object]:
    with client(gw, listener) as sdk:
        chat = sdk.chat.completions.create(model="text_generator", messages=CHAT, max_tokens=7)
        stopped = sdk.completions.create(model="text_generator", prompt="once upon a time", max_tokens=30,
                                         stop=[chat.choices[0].message.content.split()[3]], seed=3)
        chunks = list(sdk.chat.completions.create(model="text_generator", messages=CHAT, max_tokens=7, stream=True,
                                                  stream_options={"include_usage": True}))
        embedded = sdk.embeddings.create(model="text_embedder", input=["one text", "another one"])
        floats = sdk.embeddings.create(model="text_embedder", input="one text", encoding_format="float")
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    return {
        "chat": (chat.choices[0].message.role, chat.choices[0].message.content, chat.choices[0].finish_reason,
                 chat.usage.model_dump() if chat.usage else None, chat.object),
        "stopped": (stopped.choices[0].text, stopped.choices[0].finish_reason, stopped.object),
        "stream": ("".join(texts), [c.choices[0].finish_reason for c in chunks if c.choices][-1],
                   chunks[0].choices[0].delta.role, chunks[-1].usage.model_dump() if chunks[-1].usage else None,
                   len(texts) > 1),
        "embeddings": [item.embedding for item in embedded.data],
        "float": floats.data[0].embedding,
    }


async def _async_answers(gw: GatewayProcess, listener: str) -> dict[str, object]:
    async with async_client(gw, listener) as sdk:
        completion = await sdk.completions.create(model="text_generator", prompt="hello world", max_tokens=5)
        stream = await sdk.completions.create(model="text_generator", prompt="hello world", max_tokens=5,
                                              stream=True)
        pieces = [chunk.choices[0].text async for chunk in stream if chunk.choices]
        embedded = await sdk.embeddings.create(model="text_embedder", input="hello world")
    return {"completion": (completion.choices[0].text, completion.choices[0].finish_reason,
                           completion.usage.model_dump() if completion.usage else None),
            "stream": "".join(pieces), "embedding": embedded.data[0].embedding}


def test_the_sdk_gets_the_same_answers_on_every_path(gateways: GatewayProcess) -> None:
    answers = {listener: _sync_answers(gateways, listener) for listener in PATHS}
    assert answers["via-rest"] == answers["direct"]
    assert answers["via-grpc"] == answers["direct"]
    direct = answers["direct"]
    role, text, finish, usage, kind = direct["chat"]  # type: ignore[misc]
    assert (role, finish, kind) == ("assistant", "length", "chat.completion")
    assert len(text.split()) == 7 and usage["completion_tokens"] == 7
    assert usage["prompt_tokens"] == len("system: be brief\nuser: tell me a story\nassistant:".split())
    stopped_text, stopped_finish, _ = direct["stopped"]  # type: ignore[misc]
    assert stopped_finish == "stop" and len(stopped_text.split()) < 30
    streamed, stream_finish, first_role, stream_usage, several = direct["stream"]  # type: ignore[misc]
    # The stream carries the same text as the plain answer, in several chunks (decoupled, token by token).
    assert (streamed, stream_finish, first_role, several) == (text, "length", "assistant", True)
    assert stream_usage == usage
    vectors = np.array(direct["embeddings"])
    assert vectors.shape[0] == 2 and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(direct["float"], vectors[0])  # base64 (the SDK's default) and float alike


def test_the_async_sdk_gets_the_same_answers_on_every_path(gateways: GatewayProcess) -> None:
    answers = {listener: asyncio.run(_async_answers(gateways, listener)) for listener in PATHS}
    assert answers["via-rest"] == answers["direct"] == answers["via-grpc"]
    text, finish, usage = answers["direct"]["completion"]  # type: ignore[misc]
    assert answers["direct"]["stream"] == text and finish == "length" and usage["completion_tokens"] == 5


def test_a_plain_answer_and_a_stream_differ_only_in_form(gateways: GatewayProcess) -> None:
    """Raw SSE: OpenAI's chunk events, ending with ``data: [DONE]``."""
    url = f"http://{gateways.url('direct')}/v1/completions"
    body = {"model": "text_generator", "prompt": "raw", "max_tokens": 4, "stream": True, "ignored_field": [1]}
    reply = requests.post(url, json=body, timeout=10)
    assert reply.status_code == 200 and reply.headers["Content-Type"].startswith("text/event-stream")
    events = [line for line in reply.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: {") for e in events[:-1])
    assert len(events) == 4 + 2  # one per token, the finish chunk, [DONE]


def test_models_are_listed_and_looked_up(gateways: GatewayProcess) -> None:
    with client(gateways, "direct") as sdk:
        names = {model.id for model in sdk.models.list()}
        assert {"text_generator", "text_embedder", "simple"} <= names
        assert sdk.models.retrieve("text_embedder").id == "text_embedder"
        with pytest.raises(openai.NotFoundError) as info:
            sdk.models.retrieve("nope")
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_errors_come_in_openais_form(gateways: GatewayProcess) -> None:
    with client(gateways, "direct") as sdk:
        with pytest.raises(openai.BadRequestError) as info:
            sdk.chat.completions.create(model="text_generator", messages=CHAT, max_tokens=101)
        assert info.value.body["param"] == "max_tokens"  # type: ignore[index]
        assert info.value.body["type"] == "invalid_request_error"  # type: ignore[index]
        with pytest.raises(openai.NotFoundError):
            sdk.chat.completions.create(model="nope", messages=CHAT)
        with pytest.raises(openai.InternalServerError) as failed:
            sdk.embeddings.create(model="text_generator", input="x")  # no 'embedding' output: a bad upstream answer
        assert failed.value.status_code == 502 and failed.value.body["type"] == "server_error"  # type: ignore[index]
    raw = requests.post(f"http://{gateways.url('direct')}/v1/embeddings",
                        json={"model": "simple", "input": "x"}, timeout=10)
    assert set(raw.json()["error"]) == {"message", "type", "param", "code"}


def test_base64_embeddings_decode_to_the_floats(gateways: GatewayProcess) -> None:
    url = f"http://{gateways.url('direct')}/v1/embeddings"
    as_base64 = requests.post(url, json={"model": "text_embedder", "input": "x", "encoding_format": "base64"},
                              timeout=10).json()["data"][0]["embedding"]
    as_floats = requests.post(url, json={"model": "text_embedder", "input": "x"}, timeout=10).json()
    decoded = np.frombuffer(base64.b64decode(as_base64), dtype="<f4")
    assert np.array_equal(decoded, np.array(as_floats["data"][0]["embedding"], dtype=np.float32))


@pytest.mark.parametrize(("options", "words"), [
    ("max_tokens: 0", "must be at least 1"),
    ("max_tokens: 10, default_max_tokens: 11", "must be at most max_tokens (10)"),
    ("max_messages: many", "max_messages"),
    ("max_embedding_inputs: 0", "must be at least 1"),
])
def test_listener_limits_are_validated(options: str, words: str) -> None:
    text = f"""
listeners:
  - {{name: oai, protocol: openai, address: "127.0.0.1:0", {options}}}
upstreams:
  - {{name: local, protocol: builtin}}
routes:
  - {{match: {{model: "*"}}, upstream: local}}
"""
    with pytest.raises(ConfigError) as info:
        parse_yaml_config(text)
    assert words in str(info.value)


def test_a_unary_v2_call_gets_the_whole_text(gateways: GatewayProcess) -> None:
    """The decoupled text_generator answers a plain V2 infer too: the same
    text the OpenAI listener gives."""
    with client(gateways, "direct") as sdk:
        text = sdk.completions.create(model="text_generator", prompt="unary", max_tokens=6).choices[0].text
    reply = requests.post(f"http://{gateways.url('rest')}/v2/models/text_generator/infer", json={"inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["unary"]},
        {"name": "max_tokens", "datatype": "INT32", "shape": [1], "data": [6]}]}, timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [text]
