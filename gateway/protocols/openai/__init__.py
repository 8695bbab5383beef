"""OpenAI's API (``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/v1/models``) both ways: a listener for OpenAI
clients to V2 text models in Triton's LLM conventions (frontend.py,
codec.py; the mapping per route: mapping.py), and an upstream client for
OpenAI-compatible servers behind V2 clients (backend.py, upstream_codec.py,
upstream_options.py); docs/protocols.md has the mapping tables."""

from typing import Any

from gateway.protocols.registry import lazy_export

_EXPORTS = {"FRONTEND": "frontend:OpenAiFrontend", "BACKEND": "backend:OpenAiClient", "ERRORS": "errors:ERRORS"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_export(__name__, name, **_EXPORTS)
