"""BYTES: TEXT [-1] -> UPPER (ASCII letters upper-cased, BYTES) and LENGTH (bytes per element, INT64).

bytes.upper() keeps UTF-8 valid, so MLServer can answer in JSON too.
"""

from mlserver import MLModel
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput


def _as_bytes(item: object) -> bytes:
    # REST JSON delivers BYTES elements as str, gRPC raw contents as bytes.
    return item.encode() if isinstance(item, str) else bytes(item)


class Model(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        (text,) = payload.inputs
        items = [_as_bytes(x) for x in text.data]
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[
                ResponseOutput(name="UPPER", datatype="BYTES", shape=text.shape, data=[x.upper() for x in items]),
                # NumpyCodec would add a trailing dimension to a 1-D array; keep TEXT's shape.
                ResponseOutput(name="LENGTH", datatype="INT64", shape=text.shape, data=[len(x) for x in items]),
            ],
        )
