"""Decoupled builtin models: zero or many responses per request, served only
through a stream (gRPC ModelStreamInfer).

``repeat_int32`` behaves as Triton's custom repeat example backend, so
Triton's example client (simple_grpc_custom_repeat.py) runs unchanged
against the gateway: one response per element of IN, the i-th after
waiting DELAY[i] ms, each with OUT = IN[i] and IDX = i; an empty IN sends
no response. The model executes one request at a time, as one model
instance does, and lets the next one start WAIT ms after this one started
(its responses may still be coming: WAIT below the sum of DELAY
interleaves requests).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator

import numpy as np

from gateway.core.errors import invalid, unsupported
from gateway.core.types import DECOUPLED_PARAMETER, InferRequest, InferResponse, ModelMetadata, Tensor, TensorSpec
from gateway.protocols.builtin.models import MODEL_VERSION, PLATFORM, BuiltinModel

# Bounds so one request cannot hold the model (WAIT) or a stream slot
# (DELAY) for long; the demo needs seconds at most.
MAX_DELAY_MS = 10_000
MAX_RESPONSES = 10_000


def decoupled_refusal(model: str) -> str:
    """Why a unary call to a decoupled model is refused (Triton's words first)."""
    return (f"ModelInfer RPC doesn't support models with decoupled transaction policy: model '{model}' "
            "answers zero or many responses per request; call it through a stream (gRPC ModelStreamInfer)")


class DecoupledModel(BuiltinModel):
    """A model whose answer is a stream of responses (``responses``)."""

    # Whether a unary call gets an answer too (infer()), as the text generator's whole text.
    answers_unary = False

    def metadata(self) -> ModelMetadata:
        return ModelMetadata(self.name, (MODEL_VERSION,), PLATFORM, self.inputs, self.outputs,
                             {DECOUPLED_PARAMETER: True})

    def compute(self, inputs: dict[str, Tensor]) -> list[Tensor]:
        raise unsupported(decoupled_refusal(self.name))

    @abc.abstractmethod
    def responses(self, request: InferRequest) -> AsyncIterator[InferResponse]: ...


class RepeatInt32(DecoupledModel):
    name = "repeat_int32"
    inputs = (TensorSpec("IN", "INT32", (-1,)), TensorSpec("DELAY", "UINT32", (-1,)),
              TensorSpec("WAIT", "UINT32", (1,)))
    outputs = (TensorSpec("OUT", "INT32", (1,)), TensorSpec("IDX", "UINT32", (1,)))

    def __init__(self) -> None:
        self._instance = asyncio.Lock()  # the one model instance: WAIT holds it

    async def responses(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        inputs = self.check_inputs(request.inputs)
        values, delays = inputs["IN"].data, inputs["DELAY"].data
        if values.shape != delays.shape:
            raise invalid(f"expected IN and DELAY shape to match, got {list(values.shape)} and "
                          f"{list(delays.shape)}")
        if values.size > MAX_RESPONSES:
            raise invalid(f"model '{self.name}' sends at most {MAX_RESPONSES} responses per request, "
                          f"IN has {values.size} elements")
        wait_ms = int(inputs["WAIT"].data[0])
        if wait_ms > MAX_DELAY_MS or int(delays.max(initial=0)) > MAX_DELAY_MS:
            raise invalid(f"WAIT and DELAY of model '{self.name}' must be at most {MAX_DELAY_MS} ms")
        await self._instance.acquire()
        # Released after WAIT whatever becomes of this request (a cancel included).
        asyncio.get_running_loop().call_later(wait_ms / 1000, self._instance.release)
        for index, (value, delay) in enumerate(zip(values.tolist(), delays.tolist(), strict=True)):
            await asyncio.sleep(delay / 1000)
            yield InferResponse(self.name, MODEL_VERSION, request.id, [
                Tensor.from_numpy("OUT", np.array([value], dtype=np.int32), "INT32"),
                Tensor.from_numpy("IDX", np.array([index], dtype=np.uint32), "UINT32"),
            ])
