"""Runs in the kserve test virtualenv: a KServe ModelServer with this
folder's V1 test models, its REST port from ``--http_port``.

    python serve.py --http_port PORT
"""

from __future__ import annotations

import sys

import uvicorn
from kserve import ModelServer
from kserve.protocol.rest import server as rest_server
from models import all_models

_Config = uvicorn.Config


def _local_config(*args: object, **kwargs: object) -> uvicorn.Config:
    """KServe binds 0.0.0.0 with no option to choose; tests bind 127.0.0.1 only."""
    kwargs["host"] = "127.0.0.1"
    return _Config(*args, **kwargs)  # type: ignore[arg-type]


def main() -> None:
    port = int(sys.argv[sys.argv.index("--http_port") + 1])
    rest_server.uvicorn.Config = _local_config  # type: ignore[attr-defined,misc]
    ModelServer(http_port=port, enable_grpc=False, workers=1, enable_latency_logging=False).start(all_models())


if __name__ == "__main__":
    main()
