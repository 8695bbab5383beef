"""UM-Bridge protocol 1.0: a listener for UM-Bridge clients and an upstream
client for UM-Bridge servers, plus the vector <-> tensor bridge to V2 models."""

from typing import Any

from gateway.protocols.registry import lazy_export

__all__ = ["BACKEND", "ERRORS", "FRONTEND"]


def __getattr__(name: str) -> Any:
    return lazy_export(__name__, name, FRONTEND="frontend:UmbridgeFrontend", BACKEND="backend:UmbridgeClient",
                       ERRORS="errors:ERRORS")
