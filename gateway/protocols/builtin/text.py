"""Builtin text models in Triton's LLM conventions, deterministic so tests
and demos need no GPU (docs/protocols.md, "OpenAI").

``text_generator``: ``text_input`` BYTES [1] (the prompt), optional
``max_tokens`` INT32 [1] (default :data:`DEFAULT_MAX_TOKENS`), ``stream``
BOOL [1] and ``stop`` BYTES [-1] -> ``text_output`` BYTES [1]. Its tokens
are words of a small vocabulary picked by a hash of the prompt (and of the
``seed`` parameter), each written as the word and one space. Decoupled, as
Triton's vLLM model: over a stream with ``stream`` true it sends one
response per token, else one response with the whole text; a unary call
gets the whole text too. A ``stop`` string ends the text before it.

``text_embedder``: ``text_input`` BYTES [-1] -> ``embedding`` FP32 [-1, 8],
one unit vector per text, from a hash of it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterator

import numpy as np

from gateway.core.errors import invalid
from gateway.core.types import InferRequest, InferResponse, Tensor, TensorSpec
from gateway.protocols.builtin.decoupled import DecoupledModel
from gateway.protocols.builtin.models import MODEL_VERSION, BuiltinModel

DEFAULT_MAX_TOKENS = 16
# Bounds one request's work and answer.
MAX_TOKENS = 4096
MAX_PROMPT_BYTES = 1 << 20
EMBEDDING_SIZE = 8
_VOCABULARY = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
               "india", "juliett", "kilo", "lima", "mike", "november", "oscar", "papa")


def _text(tensor: Tensor, name: str) -> str:
    item = tensor.data.reshape(-1)[0]
    raw = item if isinstance(item, bytes) else str(item).encode()
    if len(raw) > MAX_PROMPT_BYTES:
        raise invalid(f"{name} is over {MAX_PROMPT_BYTES} bytes")
    return raw.decode("utf-8", "replace")


def _scalar(inputs: dict[str, Tensor], name: str, default: int) -> int:
    tensor = inputs.get(name)
    if tensor is None:
        return default
    if tensor.data.size != 1:
        raise invalid(f"input '{name}' must hold one value, got {tensor.data.size}")
    return int(tensor.data.reshape(-1)[0])


class TextGenerator(DecoupledModel):
    name = "text_generator"
    answers_unary = True
    inputs = (TensorSpec("text_input", "BYTES", (1,)), TensorSpec("max_tokens", "INT32", (1,), {"optional": True}),
              TensorSpec("stream", "BOOL", (1,), {"optional": True}),
              TensorSpec("stop", "BYTES", (-1,), {"optional": True}))
    outputs = (TensorSpec("text_output", "BYTES", (1,)),)
    optional_inputs = frozenset({"max_tokens", "stream", "stop"})

    def _tokens(self, request: InferRequest) -> tuple[Iterator[str], bool]:
        """The text's tokens in order, and whether they are to be streamed."""
        inputs = self.check_inputs(request.inputs)
        prompt = _text(inputs["text_input"], "text_input")
        count = _scalar(inputs, "max_tokens", DEFAULT_MAX_TOKENS)
        if not 0 <= count <= MAX_TOKENS:
            raise invalid(f"max_tokens must be between 0 and {MAX_TOKENS}, got {count}")
        stream = bool(_scalar(inputs, "stream", 0))
        stops = [_text(Tensor("stop", "BYTES", (1,), np.array([item], dtype=object)), "stop")
                 for item in inputs["stop"].data.reshape(-1)] if "stop" in inputs else []
        seed = request.parameters.get("seed", 0)
        return generate_text(prompt, count, [stop for stop in stops if stop], seed), stream

    def infer(self, request: InferRequest) -> list[Tensor]:
        tokens, _ = self._tokens(request)
        return [_text_output("".join(tokens))]

    async def responses(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        tokens, stream = self._tokens(request)
        if not stream:
            yield InferResponse(self.name, MODEL_VERSION, request.id, [_text_output("".join(tokens))])
            return
        for token in tokens:
            yield InferResponse(self.name, MODEL_VERSION, request.id, [_text_output(token)])
            await asyncio.sleep(0)  # a token at a time, as a model emits them: other requests go on between


def _text_output(text: str) -> Tensor:
    return Tensor("text_output", "BYTES", (1,), np.array([text.encode()], dtype=object))


def generate_text(prompt: str, count: int, stops: list[str], seed: object) -> Iterator[str]:
    """``count`` tokens from the prompt's hash; cut before the first stop
    string the text would contain."""
    digest = hashlib.sha256(f"{seed}\0{prompt}".encode()).digest()
    # A stop string ending in the new token starts at most this far back.
    reach = max((len(stop) for stop in stops), default=0)
    tail = ""  # the end of the text so far, enough to find a stop string across tokens
    for index in range(count):
        token = _VOCABULARY[(digest[index % len(digest)] + index) & 15] + " "
        window = tail + token
        cut = min((at for at in (window.find(stop) for stop in stops) if at >= 0), default=-1)
        if cut >= 0:
            if cut > len(tail):
                yield window[len(tail):cut]
            return
        tail = window[-reach:] if reach else ""
        yield token


class TextEmbedder(BuiltinModel):
    name = "text_embedder"
    inputs = (TensorSpec("text_input", "BYTES", (-1,)),)
    outputs = (TensorSpec("embedding", "FP32", (-1, EMBEDDING_SIZE)),)

    def compute(self, inputs: dict[str, Tensor]) -> list[Tensor]:
        texts = inputs["text_input"].data.reshape(-1)
        vectors = np.empty((len(texts), EMBEDDING_SIZE), dtype=np.float32)
        for row, item in enumerate(texts):
            raw = item if isinstance(item, bytes) else str(item).encode()
            digest = np.frombuffer(hashlib.sha256(raw).digest()[:EMBEDDING_SIZE], dtype=np.uint8)
            vector = digest.astype(np.float32) - np.float32(127.5)
            vectors[row] = vector / np.linalg.norm(vector)
        return [Tensor.from_numpy("embedding", vectors, "FP32")]
