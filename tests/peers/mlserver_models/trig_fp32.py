"""The builtin `trig` model on MLServer: x FP32 [-1, 2], y FP32 [-1, 1] ->
f = [sin(x0)·y0, x0·x1²] [-1, 2], g = [exp(x1/2) + y0²] [-1, 1], computed
in float32. Every request is logged with its batch size (rows), so tests can
see how the gateway batches finite-difference perturbations."""

import numpy as np
from _shared import record
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse


class Model(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        arrays = {item.name: NumpyCodec.decode_input(item) for item in payload.inputs}
        if set(arrays) != {"x", "y"}:
            raise MLServerError("trig_fp32 expects inputs x and y", status_code=400)
        x, y = arrays["x"].astype(np.float32), arrays["y"].astype(np.float32)
        if x.ndim != 2 or x.shape[1] != 2 or y.shape != (x.shape[0], 1):
            raise MLServerError(f"trig_fp32 expects x [n, 2] and y [n, 1], got {list(x.shape)} and "
                                f"{list(y.shape)}", status_code=400)
        record(self.settings, payload, rows=int(x.shape[0]))
        x0, x1, y0 = x[:, 0], x[:, 1], y[:, 0]
        f = np.stack([np.sin(x0) * y0, x0 * x1 * x1], axis=1)
        g = (np.exp(x1 / np.float32(2)) + y0 * y0).reshape(-1, 1)
        return InferenceResponse(model_name=self.name, id=payload.id,
                                 outputs=[NumpyCodec.encode_output("f", f), NumpyCodec.encode_output("g", g)])
