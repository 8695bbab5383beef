"""V2 clients -> gateway -> an OpenAI-compatible server (the ``openai`` upstream).

Behind the gateway (its own process): LiteLLM's proxy (its own virtualenv
and process, tests/peers/litellm.py) with a deterministic provider and a
master key. In front: tritonclient over HTTP (JSON and binary) and gRPC
(unary and ModelStreamInfer), and plain HTTP clients of Triton's
generate / generate_stream. Each answer is compared with what the openai
SDK gets from LiteLLM directly. The codec's pure functions are checked at
the end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import orjson
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from stream_client import Stream, final_flag
from tritonclient.utils import InferenceServerException

from gateway.app.configure import parse_config
from gateway.config.address import parse_address
from gateway.config.node import ConfigError, Node
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.types import InferRequest, RequestContext, Tensor
from gateway.protocols.openai import upstream_codec as codec
from gateway.protocols.openai.backend import OpenAiClient
from gateway.protocols.openai.upstream_options import OpenAiUpstreamOptions
from gateway.runtime.services import GatewayServices
from gateway.transport.http_server.sse import parse_events
from peers.litellm import MASTER_KEY, LiteLlmPeer, litellm  # noqa: F401 - the session-wide LiteLLM fixture
from support import GatewayProcess, free_port, write_config

WRONG_KEY = "sk-not-the-master-9d8c7b6a"
PROMPT = "the quick brown fox jumps over the lazy dog"


def config(peer: LiteLlmPeer, down: int) -> str:
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - name: llm
    protocol: openai
    endpoints: ["{peer.address}"]
    api_key_env: LLM_API_KEY
    models: {{"chat-*": chat, "embed-*": embeddings}}
  - {{name: llm-wrong-key, protocol: openai, endpoints: ["{peer.address}"], api_key_env: WRONG_LLM_KEY}}
  - {{name: llm-down, protocol: openai, endpoints: ["127.0.0.1:{down}"], api_key_env: LLM_API_KEY}}
routes:
  - {{match: {{model: wrong-key}}, upstream: llm-wrong-key, rewrite: {{model: text-echo}}}}
  - {{match: {{model: down}}, upstream: llm-down, rewrite: {{model: text-echo}}}}
  - {{match: {{model: "*"}}, upstream: llm}}
"""


@pytest.fixture(scope="module")
def gateway(litellm: LiteLlmPeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:  # noqa: F811
    directory = tmp_path_factory.mktemp("openai-upstream")
    env = {"LLM_API_KEY": MASTER_KEY, "WRONG_LLM_KEY": WRONG_KEY}
    with GatewayProcess(write_config(directory, config(litellm, free_port())), directory / "gateway.log",
                        extra_env=env) as gw:
        yield gw


@pytest.fixture(scope="module")
def sdk(litellm: LiteLlmPeer) -> openai.OpenAI:  # noqa: F811
    """The openai SDK straight to LiteLLM: the answers to match."""
    return openai.OpenAI(base_url=litellm.base_url, api_key=MASTER_KEY, max_retries=0, timeout=30)


def _direct_text(sdk: openai.OpenAI, model: str, prompt: str, **sampling: Any) -> str:
    if model.startswith("chat-"):
        answer = sdk.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], **sampling)
        return answer.choices[0].message.content or ""
    return sdk.completions.create(model=model, prompt=prompt, **sampling).choices[0].text


def _direct_stream(sdk: openai.OpenAI, model: str, prompt: str, **sampling: Any) -> list[str]:
    if model.startswith("chat-"):
        chunks = sdk.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                             stream=True, **sampling)
        return [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    return [c.choices[0].text for c in sdk.completions.create(model=model, prompt=prompt, stream=True, **sampling)
            if c.choices and c.choices[0].text]


def _text_inputs(module: Any, prompt: str, max_tokens: int | None = None, stream: bool | None = None,
                 **encoding: Any) -> list[Any]:
    """text_input, and max_tokens and stream when given (``encoding``: tritonclient.http's binary_data)."""
    values = {"text_input": ("BYTES", np.array([prompt.encode()], dtype=object)),
              "max_tokens": ("INT32", None if max_tokens is None else np.array([max_tokens], dtype=np.int32)),
              "stream": ("BOOL", None if stream is None else np.array([stream], dtype=bool))}
    inputs = []
    for name, (datatype, value) in values.items():
        if value is not None:
            tensor = module.InferInput(name, [1], datatype)
            tensor.set_data_from_numpy(value, **encoding)
            inputs.append(tensor)
    return inputs


def _text_output(result: Any) -> str:
    output = result.as_numpy("text_output")
    assert output.shape == (1,)
    item = output[0]
    return item.decode() if isinstance(item, bytes) else str(item)  # JSON outputs come back as str


# --- tritonclient HTTP and gRPC, unary ------------------------------------------------


@pytest.mark.parametrize("model", ["chat-echo", "text-echo"])
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_http_text(gateway: GatewayProcess, sdk: openai.OpenAI, model: str, binary: bool) -> None:
    """text_input and max_tokens become the prompt (or a user message) and
    max_tokens; text_output is the server's text, as the SDK gets it."""
    client = httpclient.InferenceServerClient(gateway.url("rest"))
    try:
        inputs = _text_inputs(httpclient, PROMPT, max_tokens=4, binary_data=binary)
        result = client.infer(model, inputs, outputs=[httpclient.InferRequestedOutput("text_output",
                                                                                      binary_data=binary)])
    finally:
        client.close()
    expected = _direct_text(sdk, model, PROMPT, max_tokens=4)
    assert expected == "DOG LAZY THE OVER"  # the provider's rule, so the comparison is not vacuous
    assert _text_output(result) == expected


@pytest.mark.parametrize("model", ["chat-echo", "text-echo"])
def test_grpc_text(gateway: GatewayProcess, sdk: openai.OpenAI, model: str) -> None:
    client = grpcclient.InferenceServerClient(gateway.url("grpc"))
    try:
        result = client.infer(model, _text_inputs(grpcclient, PROMPT, max_tokens=3))
    finally:
        client.close()
    assert _text_output(result) == _direct_text(sdk, model, PROMPT, max_tokens=3) == "DOG LAZY THE"


def test_vllm_sampling_parameters(gateway: GatewayProcess, sdk: openai.OpenAI) -> None:
    """Triton's vLLM model convention: the sampling fields as one JSON text input."""
    inputs = _text_inputs(grpcclient, PROMPT)
    bundled = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    bundled.set_data_from_numpy(np.array([orjson.dumps({"max_tokens": 5, "stop": ["THE"]})], dtype=object))
    client = grpcclient.InferenceServerClient(gateway.url("grpc"))
    try:
        result = client.infer("chat-echo", [*inputs, bundled])
    finally:
        client.close()
    assert _text_output(result) == _direct_text(sdk, "chat-echo", PROMPT, max_tokens=5, stop=["THE"]) == "DOG LAZY"


def test_usage_comes_back_as_parameters(gateway: GatewayProcess) -> None:
    """The server's token counts ride on the V2 answer's parameters."""
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [PROMPT]}],
            "parameters": {"max_tokens": 2}}
    reply = requests.post(f"http://{gateway.url('rest')}/v2/models/chat-echo/infer", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["outputs"][0]["data"] == ["DOG LAZY"]  # max_tokens as a request parameter
    assert answer["parameters"]["completion_tokens"] == 2
    assert answer["parameters"]["prompt_tokens"] == len(PROMPT.split())


# --- streams: ModelStreamInfer and generate_stream -----------------------------------


@pytest.mark.parametrize("model", ["chat-echo", "text-echo"])
def test_grpc_stream_relays_chunks(gateway: GatewayProcess, sdk: openai.OpenAI, model: str) -> None:
    """Each chunk with text is one response holding the new text; the last
    is marked final; together they are the SDK's streamed text."""
    expected = _direct_stream(sdk, model, PROMPT, max_tokens=5)
    assert len(expected) == 5
    with Stream(gateway.url("grpc")) as stream:
        stream.client.async_stream_infer(model, _text_inputs(grpcclient, PROMPT, max_tokens=5), request_id="s1")
        results = [stream.next() for _ in expected]
    assert all(error is None for _, error in results), [error for _, error in results]
    assert [_text_output(result) for result, _ in results] == expected
    assert [final_flag(result) for result, _ in results] == [False] * (len(expected) - 1) + [True]


def test_grpc_stream_with_stream_false_answers_once(gateway: GatewayProcess, sdk: openai.OpenAI) -> None:
    with Stream(gateway.url("grpc")) as stream:
        stream.client.async_stream_infer("chat-echo", _text_inputs(grpcclient, PROMPT, max_tokens=5, stream=False))
        result, error = stream.next()
    assert error is None, error
    assert _text_output(result) == _direct_text(sdk, "chat-echo", PROMPT, max_tokens=5)
    assert final_flag(result) is True


@pytest.mark.parametrize("model", ["chat-echo", "text-echo"])
def test_generate_stream(gateway: GatewayProcess, sdk: openai.OpenAI, model: str) -> None:
    """Triton's generate_stream: one event per chunk, text_output each."""
    reply = requests.post(f"http://{gateway.url('rest')}/v2/models/{model}/generate_stream",
                          json={"text_input": PROMPT, "max_tokens": 6, "stop": ["OVER"]}, timeout=30)
    assert reply.status_code == 200, reply.text
    events = [orjson.loads(event.data) for event in parse_events(reply.content, 1 << 20)]
    texts = [event["text_output"] for event in events]
    assert texts == _direct_stream(sdk, model, PROMPT, max_tokens=6, stop=["OVER"]) == ["DOG", " LAZY", " THE"]


def test_generate_stream_failing_model(gateway: GatewayProcess) -> None:
    """A model that fails: the V2 error answer (nothing was streamed), naming
    the upstream, quoting neither address nor key."""
    reply = requests.post(f"http://{gateway.url('rest')}/v2/models/chat-echo/generate_stream",
                          json={"text_input": "fail"}, timeout=30)
    assert reply.status_code == 502, reply.text  # LiteLLM answers 500 before it streams
    error = reply.json()["error"]
    assert "llm" in error and "asked to fail" in error
    assert MASTER_KEY not in reply.text and "127.0.0.1" not in reply.text


def test_stream_broken_midway(gateway: GatewayProcess) -> None:
    """An error event after a chunk: the chunk is delivered, not final, then
    the error, in each client's form (gRPC: an error in the stream;
    generate_stream: an error event)."""
    prompt = "break one two three"
    with Stream(gateway.url("grpc")) as stream:
        stream.client.async_stream_infer("chat-echo", _text_inputs(grpcclient, prompt))
        (first, first_error), (_, error) = stream.next(), stream.next()
    assert first_error is None and _text_output(first) == "THREE" and final_flag(first) is False
    assert error is not None and "broke its stream" in str(error) and MASTER_KEY not in str(error)
    reply = requests.post(f"http://{gateway.url('rest')}/v2/models/chat-echo/generate_stream",
                          json={"text_input": prompt}, timeout=30)
    events = [orjson.loads(event.data) for event in parse_events(reply.content, 1 << 20)]
    assert reply.status_code == 200 and events[0] == {"model_name": "chat-echo", "model_version": "",
                                                      "text_output": "THREE"}
    assert len(events) == 2 and "broke its stream" in events[1]["error"], events


def test_generate_unary(gateway: GatewayProcess, sdk: openai.OpenAI) -> None:
    reply = requests.post(f"http://{gateway.url('rest')}/v2/models/text-echo/generate",
                          json={"text_input": PROMPT, "max_tokens": 2, "temperature": 0.5}, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["text_output"] == _direct_text(sdk, "text-echo", PROMPT, max_tokens=2, temperature=0.5)


# --- embeddings -------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_embeddings(gateway: GatewayProcess, sdk: openai.OpenAI, protocol: str) -> None:
    """text_input BYTES [n] -> embedding FP32 [n, d], row i the SDK's data[i]."""
    texts = ["alpha beta", "gamma", "ü delta epsilon"]
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(gateway.url("rest" if protocol == "http" else "grpc"))
    try:
        tensor = module.InferInput("text_input", [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
        result = client.infer("embed-echo", [tensor])
    finally:
        client.close()
    got = result.as_numpy("embedding")
    direct = sdk.embeddings.create(model="embed-echo", input=texts, encoding_format="float")
    expected = np.array([item.embedding for item in sorted(direct.data, key=lambda d: d.index)], dtype=np.float32)
    assert got.dtype == np.float32 and got.shape == (3, 4)
    np.testing.assert_array_equal(got, expected)


def test_metadata_describes_the_conventions(gateway: GatewayProcess) -> None:
    client = httpclient.InferenceServerClient(gateway.url("rest"))
    try:
        chat = client.get_model_metadata("chat-echo")
        embed = client.get_model_metadata("embed-echo")
        with pytest.raises(InferenceServerException) as missing:
            client.get_model_metadata("not-served-here")
    finally:
        client.close()
    assert {i["name"]: i["datatype"] for i in chat["inputs"]}["text_input"] == "BYTES"
    assert [(o["name"], o["datatype"]) for o in chat["outputs"]] == [("text_output", "BYTES")]
    assert [(o["name"], o["datatype"], o["shape"]) for o in embed["outputs"]] == [("embedding", "FP32", [-1, -1])]
    assert missing.value.status() == "404"


# --- the key, errors, a server that is down ------------------------------------------------


def _rest_infer(gateway: GatewayProcess, model: str, prompt: str) -> requests.Response:
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}]}
    return requests.post(f"http://{gateway.url('rest')}/v2/models/{model}/infer", json=body, timeout=30)


def _grpc_refusal(gateway: GatewayProcess, model: str) -> InferenceServerException:
    client = grpcclient.InferenceServerClient(gateway.url("grpc"))
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.infer(model, _text_inputs(grpcclient, PROMPT))
    finally:
        client.close()
    return refused.value


def test_api_key_never_in_errors_or_logs(gateway: GatewayProcess, litellm: LiteLlmPeer) -> None:  # noqa: F811
    """A refused key and a failing model answer errors that quote neither
    key; the gateway's log (access log included) holds neither."""
    bodies = []
    for model, prompt in (("wrong-key", PROMPT), ("text-echo", "fail"), ("chat-echo", "fail")):
        reply = _rest_infer(gateway, model, prompt)
        assert reply.status_code >= 400, reply.text
        assert "error" in reply.json()
        bodies.append(reply.text)
    bodies.append(str(_grpc_refusal(gateway, "wrong-key")))
    for text in [*bodies, gateway.log()]:
        assert MASTER_KEY not in text and WRONG_KEY not in text
        assert MASTER_KEY[6:] not in text and WRONG_KEY[6:] not in text  # nor their tails, as servers quote them
    assert litellm.address not in "".join(bodies)
    assert "wrong-key" in gateway.log()  # the requests were logged, without the keys


def test_server_down_is_unavailable(gateway: GatewayProcess) -> None:
    reply = _rest_infer(gateway, "down", PROMPT)
    assert reply.status_code == 503, reply.text
    assert "127.0.0.1" not in reply.text
    assert _grpc_refusal(gateway, "down").status() == "StatusCode.UNAVAILABLE"
    with Stream(gateway.url("grpc")) as stream:
        stream.client.async_stream_infer("down", _text_inputs(grpcclient, PROMPT))
        _, error = stream.next()
    # A stream's errors travel in the stream as Triton's error_message, without a status.
    assert error is not None and "cannot connect to upstream llm-down" in str(error), error
    assert "127.0.0.1" not in str(error)


def test_bad_input_is_the_clients_error(gateway: GatewayProcess) -> None:
    """Two texts for a chat model, a max_tokens that is no integer: 400, never sent on."""
    rest = f"http://{gateway.url('rest')}/v2/models/chat-echo/infer"
    two = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}]}
    reply = requests.post(rest, json=two, timeout=30)
    assert reply.status_code == 400 and "one text" in reply.json()["error"]
    wrong = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
             "parameters": {"max_tokens": "many"}}
    reply = requests.post(rest, json=wrong, timeout=30)
    assert reply.status_code == 400 and "max_tokens" in reply.json()["error"]


# --- one client of its own ------------------------------------------------------------------------


async def test_streams_reuse_their_connection(litellm: LiteLlmPeer, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """After [DONE] the reply's end is read, so the next stream takes the same
    pooled connection rather than a new one."""
    monkeypatch.setenv("GW_TEST_LLM_KEY", MASTER_KEY)
    parsed = parse_config(_upstream_config(api_key_env="GW_TEST_LLM_KEY", api="chat"))
    upstream = dataclasses.replace(parsed.upstreams[0], endpoints=(parse_address(Node(litellm.address, "", [])),))
    client = OpenAiClient(upstream, upstream.endpoints[0], GatewayServices(parsed, parsed.server))
    await client.start()
    try:
        for _ in range(3):
            request = _request("chat-echo", [PROMPT], max_tokens=np.array([2], dtype=np.int32))
            parts = [part async for part in client.infer_stream(request, RequestContext("grpc", "v2-grpc"))]
            assert [bytes(p.response.outputs[0].data[0]) for p in parts] == [b"DOG", b" LAZY"]
            assert [p.final for p in parts] == [False, True]
            assert client.http is not None
            assert (client.http.open_connections, client.http.idle_connections) == (1, 1)
    finally:
        await client.close()


# --- the codec's pure functions --------------------------------------------------------------


def _request(model: str, texts: list[str], **inputs: np.ndarray) -> InferRequest:
    data = np.array([t.encode() for t in texts], dtype=object)
    tensors = [Tensor("text_input", "BYTES", (len(texts),), data)]
    tensors += [Tensor.from_numpy(name, value) for name, value in inputs.items()]
    return InferRequest(model, inputs=tensors)


def test_codec_text_request() -> None:
    request = _request("m", ["hi there"], max_tokens=np.array([7], dtype=np.int32),
                       temperature=np.array([0.25], dtype=np.float32),
                       stop=np.array([b"x", b"y"], dtype=object))
    request.parameters["top_p"] = 0.5
    chat = orjson.loads(codec.encode_text_request(request, "chat", True))
    assert chat == {"model": "m", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 7,
                    "temperature": 0.25, "top_p": 0.5, "stop": ["x", "y"], "stream": True}
    completion = orjson.loads(codec.encode_text_request(request, "completions", False))
    assert completion["prompt"] == "hi there" and "messages" not in completion and "stream" not in completion


@pytest.mark.parametrize(("change", "words"), [
    (lambda r: r.parameters.update(max_tokens=0), "max_tokens"),
    (lambda r: r.parameters.update(temperature="hot"), "temperature"),
    (lambda r: r.parameters.update(stop=["a"] * 5), "stop"),
    (lambda r: r.inputs.clear(), "text_input"),
])
def test_codec_refuses_bad_fields(change: Any, words: str) -> None:
    request = _request("m", ["hi"])
    change(request)
    with pytest.raises(GatewayError) as refused:
        codec.encode_text_request(request, "completions", False)
    assert refused.value.kind is ErrorKind.INVALID_INPUT and words in refused.value.message


def test_codec_bundled_and_aliased_fields() -> None:
    """sampling_parameters (vLLM) fills what the request does not give itself;
    TensorRT-LLM's stop_words and random_seed stand for stop and seed."""
    request = _request("m", ["hi"], sampling_parameters=np.array([b'{"max_tokens": 9, "top_p": 0.5}'], dtype=object),
                       max_tokens=np.array([3], dtype=np.int32), stop_words=np.array([b"x"], dtype=object),
                       random_seed=np.array([11], dtype=np.uint64))
    body = orjson.loads(codec.encode_text_request(request, "completions", False))
    assert body == {"model": "m", "prompt": "hi", "max_tokens": 3, "top_p": 0.5, "seed": 11, "stop": ["x"]}
    request.parameters["sampling_parameters"] = "[1]"
    request.inputs = [t for t in request.inputs if t.name != "sampling_parameters"]
    with pytest.raises(GatewayError) as refused:
        codec.encode_text_request(request, "completions", False)
    assert refused.value.kind is ErrorKind.INVALID_INPUT and "sampling_parameters" in refused.value.message


def test_codec_stream_flag() -> None:
    """A stream's request streams unless ``stream`` says false; a flag that is no boolean is refused."""
    assert codec.wants_stream(_request("m", ["hi"])) is True
    assert codec.wants_stream(_request("m", ["hi"], stream=np.array([False]))) is False
    flagged = _request("m", ["hi"])
    flagged.parameters["stream"] = "false"
    with pytest.raises(GatewayError) as refused:
        codec.wants_stream(flagged)
    assert refused.value.kind is ErrorKind.INVALID_INPUT


def test_codec_answers() -> None:
    chat = b'{"choices": [{"message": {"role": "assistant", "content": "ok"}}], "usage": {"prompt_tokens": 3}}'
    assert codec.decode_text_answer(chat, "chat") == ("ok", {"prompt_tokens": 3})
    assert codec.decode_chunk(b'{"choices": [{"delta": {"role": "assistant"}}]}', "chat") == ""
    assert codec.decode_chunk(b'{"choices": []}', "completions") is None
    with pytest.raises(GatewayError) as mid:
        codec.decode_chunk(b'{"error": {"message": "boom"}}', "chat")
    assert mid.value.kind is ErrorKind.UPSTREAM_BAD_RESPONSE and "boom" in mid.value.message
    matrix, _ = codec.decode_embeddings(b'{"data": [{"index": 1, "embedding": [3, 4]}, '
                                        b'{"index": 0, "embedding": [1, 2]}]}', 2, 100)
    np.testing.assert_array_equal(matrix, np.array([[1, 2], [3, 4]], dtype=np.float32))
    for bad in (b'{"data": [{"index": 0, "embedding": [1]}]}', b'{"data": [{"index": 0, "embedding": [1]}, '
                b'{"index": 0, "embedding": [2]}]}', b'[1]', b'{"data": [{"index": 0, "embedding": [1, 2]}, '
                b'{"index": 1, "embedding": [1]}]}'):
        with pytest.raises(GatewayError) as unreadable:
            codec.decode_embeddings(bad, 2, 100)
        assert unreadable.value.kind is ErrorKind.UPSTREAM_BAD_RESPONSE


def test_codec_errors_keep_secrets_out() -> None:
    # Servers quote a refused key in part, which no redaction of the whole key catches.
    refused = codec.decode_error(401, b'{"error": {"message": "Incorrect API key provided: sk-ab***c123"}}', "llm",
                                 ("sk-abc123",))
    assert refused.kind is ErrorKind.UPSTREAM_BAD_RESPONSE
    assert "sk-ab" not in refused.message and "c123" not in refused.message
    other = codec.decode_error(500, b'{"error": {"message": "key sk-abc123 at 10.0.0.7:8000 failed"}}', "llm",
                               ("sk-abc123",))
    assert other.kind is ErrorKind.UPSTREAM_BAD_RESPONSE
    assert "sk-abc123" not in other.message and "10.0.0.7" not in other.message and "failed" in other.message
    assert codec.decode_error(404, b"not json", "llm").kind is ErrorKind.MODEL_NOT_FOUND
    assert codec.decode_error(429, b"{}", "llm").kind is ErrorKind.UPSTREAM_OVERLOADED


# --- the upstream's keys ------------------------------------------------------------------------


def _upstream_config(**keys: object) -> dict[str, object]:
    return {"listeners": [{"name": "rest", "protocol": "v2-rest", "address": "127.0.0.1:0"}],
            "upstreams": [{"name": "llm", "protocol": "openai", "endpoints": ["127.0.0.1:1"], **keys}],
            "routes": [{"match": {"model": "*"}, "upstream": "llm"}]}


def test_upstream_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_TEST_LLM_KEY", "sk-x")
    options = parse_config(_upstream_config(base_path="/openai", api_key_env="GW_TEST_LLM_KEY", api="chat",
                                            models={"emb-*": "embeddings", "text-*": "completions"})
                           ).upstreams[0].options
    assert isinstance(options, OpenAiUpstreamOptions)
    assert (options.base_path, options.api_key_env) == ("/openai", "GW_TEST_LLM_KEY")
    assert [options.api_of(m) for m in ("emb-a", "text-b", "other")] == ["embeddings", "completions", "chat"]
    assert parse_config(_upstream_config()).upstreams[0].options.api_of("any") == "completions"


@pytest.mark.parametrize(("keys", "problem"), [
    ({"base_path": "openai"}, "base_path: must start with '/'"),
    ({"base_path": "/openai/"}, "base_path: must start with '/'"),
    ({"api": "responses"}, "api: must be one of"),
    ({"models": {"m-*": "chat-completions"}}, "models.m-*: must be one of"),
    ({"api_key_env": "GW_TEST_UNSET_VARIABLE"}, "environment variable GW_TEST_UNSET_VARIABLE is not set"),
    ({"api_key_env": "HOME", "auth": {"token": {"env": "HOME"}}}, "give api_key_env or auth, not both"),
    ({"api_keys_env": "HOME"}, "api_keys_env: unknown key"),
])
def test_upstream_key_errors(keys: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_upstream_config(**keys))
    assert problem in str(info.value)
