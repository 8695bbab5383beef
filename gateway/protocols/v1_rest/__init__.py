"""KServe V1 / TensorFlow Serving REST (``instances`` -> ``predictions``):
a listener for V1 clients (frontend.py; the mapping to canonical tensors is
codec.py, documented in docs/protocols.md) and an upstream client for V1
servers behind any client (backend.py, upstream_codec.py; docs/v1-rest.md)."""

from typing import Any

from gateway.protocols.registry import lazy_export

# The operation (DataPlane.call_operation) that forwards a V1 ``:explain``
# call: its request carries the client's body as ``raw`` and the answer is
# the upstream's JSON body (bytes). Upstreams that do not offer it raise
# UNSUPPORTED, which the listener answers 501.
EXPLAIN_OPERATION = "v1_explain"

_EXPORTS = {"FRONTEND": "frontend:V1RestFrontend", "BACKEND": "backend:V1RestClient", "ERRORS": "errors:ERRORS"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_export(__name__, name, **_EXPORTS)
