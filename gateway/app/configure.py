"""The configuration as the app reads it: the config package's parser and
schema (gateway/config/), handed the protocol and filter registries. The
config imports no protocol and no filter; this is where they meet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.config import model, schema
from gateway.config.model import GatewayConfig
from gateway.dataplane.filters import registry as filters
from gateway.protocols import registry


def parse_config(data: Any, source: str = "<string>", base_dir: Path | None = None) -> GatewayConfig:
    """A config from YAML data, every protocol's and filter's options parsed by its own code."""
    return model.parse_config(data, source, base_dir, protocols=registry, filters=filters)


def load_config(path: str | Path | None = None) -> GatewayConfig:
    """A config file (the embedded default when ``path`` is None)."""
    return model.load_config(path, protocols=registry, filters=filters)


def build_schema() -> schema.Json:
    """The JSON schema of a config file, naming the registries' protocols and filter kinds."""
    return schema.build_schema(registry, filters)
