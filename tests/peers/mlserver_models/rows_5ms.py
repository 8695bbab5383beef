"""A model that costs a fixed 5 ms per call whatever its rows (calls run one
at a time, as on one accelerator), for dynamic batching: every input X comes
back as X_OUT, row by row: numbers as 2x+1 (BOOL negated), BYTES reversed
with b"!" appended. A number -7 anywhere fails the whole call (a poisoned
batch). MLServer's adaptive batching is off here (rows_5ms_adaptive has it on).
Each call is recorded with its rows and the first number of every row of its
first input (``firsts``), so a test can tell whose rows went up, and how often.
"""

import asyncio

import numpy as np
from _shared import record
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput

COST_SECONDS = 0.005
POISON = -7


def _as_bytes(item: object) -> bytes:
    # REST JSON delivers BYTES elements as str, gRPC raw contents as bytes.
    return item.encode() if isinstance(item, str) else bytes(item)


class Model(MLModel):
    async def load(self) -> bool:
        self._busy = asyncio.Lock()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        outputs = []
        firsts: list[object] = []
        for item in payload.inputs:
            name = f"{item.name}_OUT"
            if item.datatype == "BYTES":
                data = [_as_bytes(x)[::-1] + b"!" for x in item.data]
                outputs.append(ResponseOutput(name=name, datatype="BYTES", shape=item.shape, data=data))
                continue
            array = np.asarray(NumpyCodec.decode_input(item)).reshape(item.shape)
            if item.datatype != "BOOL" and np.any(array == POISON):
                raise MLServerError(f"input {item.name} holds the poison value {POISON}", status_code=400)
            if item is payload.inputs[0] and array.ndim == 2:
                firsts = array[:, 0].tolist()
            result = np.logical_not(array) if item.datatype == "BOOL" else (array * 2 + 1).astype(array.dtype)
            outputs.append(ResponseOutput(name=name, datatype=item.datatype, shape=item.shape,
                                          data=result.reshape(-1).tolist()))
        async with self._busy:
            await asyncio.sleep(COST_SECONDS)
        record(self.settings, payload, rows=payload.inputs[0].shape[0] if payload.inputs else 0,
               firsts=firsts)
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=outputs)
