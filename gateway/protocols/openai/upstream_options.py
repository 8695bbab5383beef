"""The ``openai`` upstream's YAML keys: where the server mounts the API,
where its API key lives, and which API (completions, chat, embeddings)
serves each model (docs/protocols.md, "The openai upstream")."""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass

from gateway.config.node import Node
from gateway.transport.upstream import parse_response_limit

COMPLETIONS, CHAT, EMBEDDINGS = "completions", "chat", "embeddings"
APIS = (COMPLETIONS, CHAT, EMBEDDINGS)


@dataclass(frozen=True, slots=True)
class OpenAiUpstreamOptions:
    base_path: str = ""  # KServe mounts the API under /openai
    api_key_env: str | None = None  # the variable holding the key sent as Authorization: Bearer
    api: str = COMPLETIONS  # for a model no glob of `models` matches
    # (compiled model glob, api), first match wins
    models: tuple[tuple[re.Pattern[str], str], ...] = ()
    max_connections: int = 64  # per endpoint
    max_response_bytes: int | None = None  # None: 4 x limits.max_request_bytes

    def api_of(self, model: str) -> str:
        for pattern, api in self.models:
            if pattern.fullmatch(model):
                return api
        return self.api


def _models(node: Node) -> tuple[tuple[re.Pattern[str], str], ...]:
    models: list[tuple[re.Pattern[str], str]] = []
    for glob, child in node.entries():
        if child.value not in APIS:
            child.error(f"must be one of {', '.join(APIS)}; got {child.value!r}")
            continue
        models.append((re.compile(fnmatch.translate(glob)), str(child.value)))
    return tuple(models)


def parse_upstream_options(node: Node) -> OpenAiUpstreamOptions:
    base_path = node.string("base_path", "")
    if isinstance(base_path, str) and base_path and (not base_path.startswith("/") or base_path.endswith("/")):
        node.error("must start with '/' and not end with one (empty: the API at /v1)", "base_path")
    api_key_env = node.string("api_key_env", None)
    if api_key_env is not None:
        if node.has("auth"):
            node.error("give api_key_env or auth, not both (both set the Authorization header)", "api_key_env")
        if not os.environ.get(api_key_env, "").strip():
            node.error(f"environment variable {api_key_env} is not set", "api_key_env")
    return OpenAiUpstreamOptions(
        base_path=base_path if isinstance(base_path, str) else "",
        api_key_env=api_key_env,
        api=node.choice("api", APIS, COMPLETIONS),
        models=_models(node.child("models", {})),
        max_connections=node.integer("max_connections", 64, minimum=1),
        max_response_bytes=parse_response_limit(node),
    )
