"""A model with a fixed service time: 20 ms a call, one call at a time (as
on one accelerator), so requests queue in the server and its
``rest_server_requests_in_progress`` gauge shows the queue. It answers
every input X as X_OUT unchanged. The load-aware picking tests use it."""

import asyncio

from mlserver import MLModel
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput

SERVICE_SECONDS = 0.020


class Model(MLModel):
    async def load(self) -> bool:
        self._busy = asyncio.Lock()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        async with self._busy:
            await asyncio.sleep(SERVICE_SECONDS)
        outputs = [ResponseOutput(name=f"{item.name}_OUT", datatype=item.datatype, shape=item.shape, data=item.data)
                   for item in payload.inputs]
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=outputs)
