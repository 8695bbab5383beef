"""INPUT0 FP32 of any shape -> OUTPUT0, unchanged (for big tensors)."""

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class Model(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        array = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(model_name=self.name, id=payload.id,
                                 outputs=[NumpyCodec.encode_output("OUTPUT0", array)])
