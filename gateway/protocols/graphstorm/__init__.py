"""GraphStorm real-time inference (gs-realtime-v0.1): listener and upstream
client; the graph tensor contract they share with GNN models on V2 servers
is gateway/core/graphtensors.py."""

from typing import Any

from gateway.protocols.registry import lazy_export

__all__ = ["BACKEND", "ERRORS", "FRONTEND"]


def __getattr__(name: str) -> Any:
    return lazy_export(__name__, name, FRONTEND="frontend:GraphStormFrontend", BACKEND="backend:GraphStormClient",
                       ERRORS="errors:ERRORS")
