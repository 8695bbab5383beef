"""Like Triton's `simple`: INPUT0, INPUT1 INT32 [-1, 16] -> OUTPUT0 = sum, OUTPUT1 = difference."""

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse, Parameters


def _user_parameters(parameters: Parameters | None) -> Parameters | None:
    """The request's own parameters, to echo. MLServer adds the transport
    headers under "headers"; echoing those would make it answer with the
    request's Content-Length and break its own reply."""
    if parameters is None:
        return None
    own = {k: v for k, v in parameters.model_dump(exclude_none=True).items() if k != "headers"}
    return Parameters(**own) if own else None


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
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            id=payload.id,
            parameters=_user_parameters(payload.parameters),
            outputs=[NumpyCodec.encode_output("OUTPUT0", a + b), NumpyCodec.encode_output("OUTPUT1", a - b)],
        )
