"""A LiteLLM custom provider of the test suite: deterministic answers for
completions, chat, streaming and embeddings, so a test can compare what
the gateway relays with what the OpenAI SDK gets from LiteLLM directly.

The text for a prompt is its words reversed, each upper-cased, cut to
``max_tokens`` words and at the first ``stop`` word; streamed, each word
(with its leading space) is one chunk. An embedding of a text is 4 numbers
from its length and its bytes. A prompt of ``fail`` raises (LiteLLM
answers it as an error); a streamed prompt starting ``break`` raises after
its first chunk.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import litellm
from litellm import CustomLLM
from litellm.types.utils import EmbeddingResponse, GenericStreamingChunk, ModelResponse


def _prompt(messages: list[dict[str, Any]]) -> str:
    content = messages[-1].get("content", "") if messages else ""
    if isinstance(content, list):  # content parts
        content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def answer_words(prompt: str, optional_params: dict[str, Any]) -> list[str]:
    if prompt.strip() == "fail":
        raise ValueError("the test provider was asked to fail")
    words = [word.upper() for word in reversed(prompt.split())]
    stop = optional_params.get("stop") or []
    for i, word in enumerate(words):
        if word in ([stop] if isinstance(stop, str) else stop):
            words = words[:i]
            break
    limit = optional_params.get("max_tokens") or optional_params.get("max_completion_tokens")
    return words[: int(limit)] if limit else words


def _pieces(words: list[str]) -> list[str]:
    return [("" if i == 0 else " ") + word for i, word in enumerate(words)]


class Deterministic(CustomLLM):
    def _response(self, model: str, messages: list[dict[str, Any]], optional_params: dict[str, Any]) -> ModelResponse:
        prompt = _prompt(messages)
        words = answer_words(prompt, optional_params)
        return litellm.ModelResponse(
            model=model,
            choices=[{"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": " ".join(words)}}],
            usage={"prompt_tokens": len(prompt.split()), "completion_tokens": len(words),
                   "total_tokens": len(prompt.split()) + len(words)},
        )

    def completion(self, model: str, messages: list[dict[str, Any]], *args: Any, **kwargs: Any) -> ModelResponse:
        return self._response(model, messages, kwargs.get("optional_params") or {})

    async def acompletion(self, model: str, messages: list[dict[str, Any]], *args: Any, **kwargs: Any) -> ModelResponse:
        return self._response(model, messages, kwargs.get("optional_params") or {})

    def _chunks(self, messages: list[dict[str, Any]], optional_params: dict[str, Any]) -> list[GenericStreamingChunk]:
        pieces = _pieces(answer_words(_prompt(messages), optional_params))
        chunks: list[GenericStreamingChunk] = []
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            chunks.append({"text": piece, "is_finished": last, "finish_reason": "stop" if last else None,
                           "usage": None, "index": 0, "tool_use": None})
        if not chunks:
            chunks.append({"text": "", "is_finished": True, "finish_reason": "stop", "usage": None, "index": 0,
                           "tool_use": None})
        return chunks

    def streaming(self, model: str, messages: list[dict[str, Any]], *args: Any,
                  **kwargs: Any) -> Iterator[GenericStreamingChunk]:
        yield from self._chunks(messages, kwargs.get("optional_params") or {})

    async def astreaming(self, model: str, messages: list[dict[str, Any]], *args: Any,
                         **kwargs: Any) -> AsyncIterator[GenericStreamingChunk]:
        prompt = _prompt(messages)
        for chunk in self._chunks(messages, kwargs.get("optional_params") or {}):
            yield chunk
            if prompt.startswith("break "):  # fails once its first chunk is on its way
                raise RuntimeError("the test provider broke its stream")

    def _embeddings(self, model: str, input: list[str] | str) -> EmbeddingResponse:
        texts = [input] if isinstance(input, str) else list(input)
        data = []
        for i, text in enumerate(texts):
            raw = text.encode()
            vector = [float(len(raw)), float(sum(raw) % 997) / 7.0, float(len(text.split())), 0.5 + i]
            data.append({"object": "embedding", "index": i, "embedding": vector})
        return EmbeddingResponse(model=model, data=data, usage=litellm.Usage(prompt_tokens=len(texts),
                                                                              total_tokens=len(texts)))

    def embedding(self, model: str, input: Any, *args: Any, **kwargs: Any) -> EmbeddingResponse:
        return self._embeddings(model, input)

    async def aembedding(self, model: str, input: Any, *args: Any, **kwargs: Any) -> EmbeddingResponse:
        return self._embeddings(model, input)


handler = Deterministic()
