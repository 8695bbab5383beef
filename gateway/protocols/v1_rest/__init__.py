"""KServe V1 / TensorFlow Serving REST (``instances`` -> ``predictions``):
an upstream client for V1 servers behind any client."""

from typing import Any

from gateway.protocols.registry import lazy_export

__all__ = ["BACKEND", "ERRORS"]


def __getattr__(name: str) -> Any:
    return lazy_export(__name__, name, BACKEND="backend:V1RestClient", ERRORS="errors:ERRORS")
