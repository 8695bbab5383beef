"""What the test models share.

``request_parameters``: a request's own parameters. MLServer adds the
transport headers under "headers"; a model echoing those would make MLServer
answer with the request's Content-Length and break its own reply.

``record``: a log of the requests a model received, for tests to read. One
JSON line per request in ``calls.jsonl`` of the model's own folder
(MLServer sets ``parameters.uri`` to it); ``MLServerPeer.calls(model)``
reads it back. Models run in the server process (``parallel_workers: 0``)
and write each line whole, so lines never interleave.
"""

import json
from pathlib import Path
from typing import Any

from mlserver.settings import ModelSettings
from mlserver.types import InferenceRequest


def request_parameters(payload: InferenceRequest) -> dict[str, Any]:
    """The request's own parameters, without the transport headers."""
    if payload.parameters is None:
        return {}
    return {k: v for k, v in payload.parameters.model_dump(exclude_none=True).items() if k != "headers"}


def record(settings: ModelSettings, payload: InferenceRequest, **facts: Any) -> None:
    entry = {
        "id": payload.id,
        "parameters": request_parameters(payload),
        "inputs": [[i.name, i.datatype, list(i.shape)] for i in payload.inputs],
        **facts,
    }
    folder = Path(settings.parameters.uri if settings.parameters and settings.parameters.uri else ".")
    with open(folder / "calls.jsonl", "a") as log:
        log.write(json.dumps(entry) + "\n")
