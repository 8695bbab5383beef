"""The openai SDK -> the gateway's ``openai`` listener -> the ``openai``
upstream -> LiteLLM's proxy (tests/peers/litellm.py): the SDK gets the
answers (text, finish_reason, the server's usage) it gets from the proxy
directly, sync and async, streamed and not; chat, completions and
embeddings.

A chat reaches the server as its last message's content in one user
message (the route's chat_template: docs/protocols.md, "OpenAI" — an
``openai`` upstream behind an ``openai`` listener).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest

from peers.litellm import MASTER_KEY, LiteLlmPeer, litellm  # noqa: F401 - the session-wide LiteLLM fixture
from support import GatewayProcess, write_config

PROMPT = "the quick brown fox jumps over the lazy dog"
CHAT = [{"role": "user", "content": PROMPT}]
# (max_tokens, stop): cut by max_tokens, cut by a stop word, the whole answer.
SAMPLINGS: list[dict[str, Any]] = [{"max_tokens": 4}, {"stop": ["FOX"]}, {}]


def config(peer: LiteLlmPeer) -> str:
    return f"""
admin: {{address: null}}
listeners:
  - {{name: oai, protocol: openai, address: "127.0.0.1:0", max_tokens: 100, default_max_tokens: 100}}
upstreams:
  - name: llm
    protocol: openai
    endpoints: ["{peer.address}"]
    api_key_env: LLM_API_KEY
    models: {{"chat-*": chat, "embed-*": embeddings}}
routes:
  - match: {{model: "*"}}
    upstream: llm
    options: {{openai: {{chat_template: {{message: "{{content}}", generation_prompt: ""}}}}}}
"""


@pytest.fixture(scope="module")
def gateway(litellm: LiteLlmPeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:  # noqa: F811
    directory = tmp_path_factory.mktemp("openai-both-ways")
    with GatewayProcess(write_config(directory, config(litellm)), directory / "gateway.log",
                        extra_env={"LLM_API_KEY": MASTER_KEY}) as gw:
        yield gw
        assert "Traceback" not in gw.log()
        assert MASTER_KEY not in gw.log()


def _clients(gateway: GatewayProcess, peer: LiteLlmPeer) -> tuple[openai.OpenAI, openai.OpenAI]:
    via = openai.OpenAI(base_url=f"http://{gateway.url('oai')}/v1", api_key="unused", max_retries=0, timeout=30)
    direct = openai.OpenAI(base_url=peer.base_url, api_key=MASTER_KEY, max_retries=0, timeout=30)
    return via, direct


def _unary(sdk: openai.OpenAI, api: str, sampling: dict[str, Any]) -> tuple[str, str, tuple[int, int]]:
    if api == "chat":
        answer = sdk.chat.completions.create(model="chat-echo", messages=CHAT, **sampling)  # type: ignore[arg-type]
        choice = answer.choices[0]
        text = choice.message.content or ""
    else:
        completion = sdk.completions.create(model="text-echo", prompt=PROMPT, **sampling)
        text, choice = completion.choices[0].text, completion.choices[0]  # type: ignore[assignment]
        answer = completion  # type: ignore[assignment]
    assert answer.usage is not None
    return text, choice.finish_reason, (answer.usage.prompt_tokens, answer.usage.completion_tokens)


def _streamed(sdk: openai.OpenAI, api: str, sampling: dict[str, Any]) -> tuple[list[str], str | None]:
    chunks: list[Any]
    if api == "chat":
        chunks = list(sdk.chat.completions.create(model="chat-echo", messages=CHAT, stream=True,  # type: ignore
                                                  **sampling))
        texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    else:
        chunks = list(sdk.completions.create(model="text-echo", prompt=PROMPT, stream=True, **sampling))
        texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return texts, finishes[-1] if finishes else None


@pytest.mark.parametrize("streamed", [False, True], ids=["unary", "streamed"])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["max_tokens", "stop", "whole"])
@pytest.mark.parametrize("api", ["chat", "completions"])
def test_same_answers(gateway: GatewayProcess, litellm: LiteLlmPeer, api: str,  # noqa: F811
                      sampling: dict[str, Any], streamed: bool) -> None:
    """Text (streamed: the same chunks), finish_reason and (unary) usage."""
    via, direct = _clients(gateway, litellm)
    ask = _streamed if streamed else _unary
    with via, direct:
        got, expected = ask(via, api, sampling), ask(direct, api, sampling)
    assert expected[0]  # the provider answered text, so the comparison is not vacuous
    assert got[0] == expected[0] and got[2:] == expected[2:]
    # The finish reason is the listener's: "length" where max_tokens cut the text (the test
    # provider says "stop" always, as some servers do).
    assert got[1] == ("length" if "max_tokens" in sampling else expected[1])


async def test_async_clients_same_answers(gateway: GatewayProcess, litellm: LiteLlmPeer) -> None:  # noqa: F811
    """The async SDK, several requests at once, streamed and not."""
    via = openai.AsyncOpenAI(base_url=f"http://{gateway.url('oai')}/v1", api_key="unused", max_retries=0,
                             timeout=30)
    direct = openai.AsyncOpenAI(base_url=litellm.base_url, api_key=MASTER_KEY, max_retries=0, timeout=30)

    async def chat(sdk: openai.AsyncOpenAI, max_tokens: int) -> str:
        answer = await sdk.chat.completions.create(model="chat-echo", messages=CHAT,  # type: ignore[arg-type]
                                                   max_tokens=max_tokens)
        return answer.choices[0].message.content or ""

    async def streamed(sdk: openai.AsyncOpenAI, max_tokens: int) -> list[str]:
        stream = await sdk.completions.create(model="text-echo", prompt=PROMPT, max_tokens=max_tokens, stream=True)
        return [chunk.choices[0].text async for chunk in stream if chunk.choices and chunk.choices[0].text]

    async with via, direct:
        calls = [(chat, n) for n in (1, 3, 5)] + [(streamed, n) for n in (2, 6)]
        got = await asyncio.gather(*(call(via, n) for call, n in calls))
        expected = await asyncio.gather(*(call(direct, n) for call, n in calls))
    assert all(expected) and got == expected


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_embeddings_same_vectors(gateway: GatewayProcess, litellm: LiteLlmPeer, mode: str) -> None:  # noqa: F811
    texts = ["alpha beta", "gamma", "ü delta epsilon"]

    async def both_async() -> list[Any]:
        via = openai.AsyncOpenAI(base_url=f"http://{gateway.url('oai')}/v1", api_key="unused", max_retries=0,
                                 timeout=30)
        direct = openai.AsyncOpenAI(base_url=litellm.base_url, api_key=MASTER_KEY, max_retries=0, timeout=30)
        async with via, direct:
            return [await sdk.embeddings.create(model="embed-echo", input=texts, encoding_format="float")
                    for sdk in (via, direct)]

    if mode == "async":
        got, expected = asyncio.run(both_async())
    else:
        via, direct = _clients(gateway, litellm)
        with via, direct:
            got, expected = [sdk.embeddings.create(model="embed-echo", input=texts, encoding_format="float")
                             for sdk in (via, direct)]
    assert len(expected.data) == len(texts)
    assert got.usage.prompt_tokens == expected.usage.prompt_tokens == len(texts)  # the server's count, not words
    # The V2 side carries FP32: the server's numbers rounded to float32.
    assert [d.index for d in got.data] == [d.index for d in expected.data]
    np.testing.assert_array_equal(np.array([d.embedding for d in got.data], dtype=np.float32),
                                  np.array([d.embedding for d in expected.data], dtype=np.float32))
