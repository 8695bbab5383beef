"""Open Inference Protocol (V2) over REST, with Triton's binary extension:
a listener and an upstream client."""

from typing import Any

from gateway.protocols.registry import lazy_export

__all__ = ["BACKEND", "ERRORS", "FRONTEND"]

# Its binary body's framing (gateway/protocols/registry.py: never forwarded).
FRAMING_HEADERS = ("inference-header-content-length",)


def __getattr__(name: str) -> Any:
    return lazy_export(__name__, name, FRONTEND="frontend:V2RestFrontend", BACKEND="backend:V2RestClient",
                       ERRORS="errors:ERRORS")
