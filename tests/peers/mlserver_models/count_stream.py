"""A streaming model: IN INT32 [n] -> n responses, one per element, OUT
INT32 [1] (the element) and IDX INT32 [1] (its index), each after
``delay_ms`` (request parameter, default 10). An element below 0 fails
the request there (after the responses before it). ``pad_elements``
(parameter) adds an output PAD FP32 [k] to each response, for tests of
backpressure. Each request logs ``started``, then ``sent`` after every
response and ``ended`` (``completed``, ``failed`` or ``cancelled``) to
calls.jsonl, so tests see how far the stream went and how it ended."""

import asyncio
from collections.abc import AsyncIterator

import numpy as np
from _shared import record, request_parameters
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse


class Model(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        raise MLServerError("count_stream answers streams only", status_code=400)

    async def predict_stream(self, payloads: AsyncIterator[InferenceRequest]) -> AsyncIterator[InferenceResponse]:
        async for payload in payloads:
            async for response in self._one(payload):
                yield response

    async def _one(self, payload: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        values = NumpyCodec.decode_input(payload.inputs[0]).reshape(-1)
        own = request_parameters(payload)
        delay = float(own.get("delay_ms", 10)) / 1000
        pad = int(own.get("pad_elements", 0))
        tag = own.get("tag", "")
        record(self.settings, payload, event="started", tag=tag)
        ended = "cancelled"
        try:
            for index, value in enumerate(values):
                await asyncio.sleep(delay)
                if value < 0:
                    ended = "failed"
                    raise MLServerError(f"element {index} is negative", status_code=400)
                outputs = [NumpyCodec.encode_output("OUT", np.array([value], dtype=np.int32)),
                           NumpyCodec.encode_output("IDX", np.array([index], dtype=np.int32))]
                if pad:
                    outputs.append(NumpyCodec.encode_output("PAD", np.zeros(pad, dtype=np.float32)))
                yield InferenceResponse(model_name=self.name, id=payload.id, outputs=outputs)
                record(self.settings, payload, event="sent", index=index, tag=tag)
            ended = "completed"
        finally:
            record(self.settings, payload, event="ended", how=ended, tag=tag)
