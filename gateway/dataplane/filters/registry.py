"""Which filter kinds a policy may name, and where their code lives.

One line per filter: its kind (the policy's key in the YAML) and its class as
"module:Class", imported on first use so a gateway that configures no policy
imports none. A new filter = one module + one line here.
"""

from __future__ import annotations

import importlib
from typing import Any

from gateway.config.node import Node
from gateway.dataplane.filters.base import Filter

FILTERS: dict[str, str] = {
    "response_cache": "gateway.dataplane.filters.response_cache:ResponseCache",
    "payload_log": "gateway.dataplane.filters.payload_log:PayloadLogFilter",
    "rate_limit": "gateway.dataplane.filters.rate_limit:RateLimitFilter",
}


def kinds() -> list[str]:
    return sorted(FILTERS)


def load(kind: str) -> type[Filter]:
    """The filter class of ``kind``; KeyError if unknown."""
    module, _, name = FILTERS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def parse_options(kind: str, node: Node) -> Any:
    return load(kind).parse_options(node)


def options_schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = load(kind).options_schema()
    return schema
