"""Which protocol names the config accepts, and where their code lives.

Entries are import paths, loaded on first use, so a gateway that never
configures gRPC never imports grpcio.
"""

from __future__ import annotations

import importlib
from typing import Any

# protocol name -> "module:Class" for each side it offers.
FRONTENDS: dict[str, str] = {
    "v2-rest": "gateway.protocols.v2_rest.frontend:V2RestFrontend",
    "v2-grpc": "gateway.protocols.v2_grpc.frontend:V2GrpcFrontend",
    "graphstorm": "gateway.protocols.graphstorm.frontend:GraphStormFrontend",
    "umbridge": "gateway.protocols.umbridge.frontend:UmbridgeFrontend",
}
BACKENDS: dict[str, str] = {
    "builtin": "gateway.builtin.backend:BuiltinClient",
    "v2-rest": "gateway.protocols.v2_rest.backend:V2RestClient",
    "v2-grpc": "gateway.protocols.v2_grpc.backend:V2GrpcClient",
    "graphstorm": "gateway.protocols.graphstorm.backend:GraphStormClient",
    "umbridge": "gateway.protocols.umbridge.backend:UmbridgeClient",
}


def _table(side: str) -> dict[str, str]:
    if side == "frontend":
        return FRONTENDS
    if side == "backend":
        return BACKENDS
    raise ValueError(side)


def names(side: str) -> list[str]:
    return sorted(_table(side))


def load(protocol: str, side: str) -> Any:
    """The frontend or backend class for a protocol; KeyError if unknown."""
    module_name, _, attr = _table(side)[protocol].partition(":")
    return getattr(importlib.import_module(module_name), attr)
