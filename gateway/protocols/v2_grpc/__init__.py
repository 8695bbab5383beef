"""Open Inference Protocol (V2) over gRPC: a listener and an upstream client
(grpcio, imported only where a listener or an upstream speaks it)."""

from typing import Any

from gateway.protocols.registry import lazy_export

__all__ = ["BACKEND", "ERRORS", "FRONTEND"]

# gRPC reserves these metadata keys for itself (registry.py: never forwarded).
FRAMING_HEADERS = ("grpc-*",)


def __getattr__(name: str) -> Any:
    return lazy_export(__name__, name, FRONTEND="frontend:V2GrpcFrontend", BACKEND="backend:V2GrpcClient",
                       ERRORS="errors:ERRORS")
