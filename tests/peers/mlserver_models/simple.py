"""Like Triton's `simple`: INPUT0, INPUT1 INT32 [-1, 16] -> OUTPUT0 = sum, OUTPUT1 = difference."""

from _shared import request_parameters
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse, Parameters


class Model(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        arrays = {item.name: NumpyCodec.decode_input(item) for item in payload.inputs}
        if set(arrays) != {"INPUT0", "INPUT1"}:
            raise MLServerError("simple expects inputs INPUT0 and INPUT1", status_code=400)
        a, b = arrays["INPUT0"], arrays["INPUT1"]
        if a.shape != b.shape:
            raise MLServerError("INPUT0 and INPUT1 must have the same shape", status_code=400)
        own = request_parameters(payload)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            id=payload.id,
            parameters=Parameters(**own) if own else None,
            outputs=[NumpyCodec.encode_output("OUTPUT0", a + b), NumpyCodec.encode_output("OUTPUT1", a - b)],
        )
