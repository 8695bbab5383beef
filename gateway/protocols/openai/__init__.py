"""OpenAI's API (``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/v1/models``): an upstream client for OpenAI-compatible
servers behind V2 clients, in Triton's LLM conventions (backend.py,
upstream_codec.py, upstream_options.py; docs/protocols.md)."""

from typing import Any

from gateway.protocols.registry import lazy_export

_EXPORTS = {"BACKEND": "backend:OpenAiClient", "ERRORS": "errors:ERRORS"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_export(__name__, name, **_EXPORTS)
