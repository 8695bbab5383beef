"""``gateway check``: a config's errors and warnings, as lines for people or
one JSON object for CI pipelines (``--format json``)."""

from __future__ import annotations

import importlib.resources
import json
import re
import sys
from dataclasses import asdict, dataclass
from typing import Any

import yaml

from gateway.app.configure import load_config
from gateway.config.model import DEFAULT_CONFIG_RESOURCE, GatewayConfig, starvation_warnings
from gateway.config.node import ConfigError
from gateway.config.reader import compose_yaml, read_config_text
from gateway.dataplane.routing import shadow_warnings
from gateway.runtime import fdlimit

# "routes[2].match.model: message" (confignode.Node.error); other texts have no path.
_PATH = re.compile(r"^(<root>|[A-Za-z_][\w-]*(?:\[\d+\]|\.[^.\[\s:]+)*): (.*)$", re.DOTALL)
_YAML_AT = re.compile(r"^line (\d+), column \d+: ")
_SEGMENT = re.compile(r"\[(\d+)\]|\.?([^.\[]+)")


@dataclass(frozen=True, slots=True)
class Finding:
    path: str | None  # YAML path, e.g. "routes[2].match.model"
    line: int | None  # 1-based line in the file, when it can be told
    message: str


def yaml_line(text: str, path: str) -> int | None:
    """The line of ``path`` in the YAML ``text``; for a key that is missing
    (``is required``), the line of its nearest parent that is there."""
    node = compose_yaml(text)
    if node is None:
        return None
    line = node.start_mark.line + 1
    if path == "<root>":
        return line
    for match in _SEGMENT.finditer(path):
        index, key = match.group(1), match.group(2)
        if index is not None and isinstance(node, yaml.SequenceNode) and int(index) < len(node.value):
            node = node.value[int(index)]
            line = node.start_mark.line + 1
        elif key is not None and isinstance(node, yaml.MappingNode):
            found = next(((k, v) for k, v in node.value if k.value == key), None)
            if found is None:
                break
            line, node = found[0].start_mark.line + 1, found[1]
        else:
            break
    return line


def finding(text: str, source: str | None) -> Finding:
    """A problem or warning line as path, line and message."""
    at = _YAML_AT.match(text)
    if at:
        return Finding(None, int(at.group(1)), text[at.end():])
    match = _PATH.match(text)
    if not match:
        return Finding(None, None, text)
    path = match.group(1)
    return Finding(path, yaml_line(source, path) if source is not None else None, match.group(2))


def _source_text(path: str | None) -> str | None:
    try:
        if path is None:
            return importlib.resources.files("gateway.config").joinpath(DEFAULT_CONFIG_RESOURCE).read_text()
        return read_config_text(path)
    except (OSError, ConfigError):
        return None


def warnings_of(config: GatewayConfig) -> list[str]:
    return starvation_warnings(config) + shadow_warnings(config)


def run_check(path: str | None, output: str = "plain") -> int:
    """Exit status: 1 when the config has errors, else 0 (warnings or not)."""
    errors: list[str] = []
    warnings: list[str] = []
    config: GatewayConfig | None = None
    try:
        config = load_config(path)
    except ConfigError as exc:
        errors = list(exc.problems)
    # Against the hard limit: `gateway serve` raises the soft one to it.
    too_many = fdlimit.open_file_warning(config, fdlimit.open_file_limit()[1]) if config else None
    if config is not None:
        warnings = warnings_of(config)
    if output == "json":
        source = _source_text(path) if errors or warnings else None
        report: dict[str, Any] = {
            "config": config.source if config else (path or "<embedded default>"),
            "ok": config is not None,
            "errors": [asdict(finding(e, source)) for e in errors],
            "warnings": [asdict(finding(w, source)) for w in warnings]
            + ([asdict(Finding(None, None, too_many))] if too_many else []),
            "listeners": len(config.listeners) if config else None,
            "upstreams": len(config.upstreams) if config else None,
            "routes": len(config.routes) if config else None,
        }
        print(json.dumps(report, indent=2))
        return 0 if config is not None else 1
    if config is None:
        for problem in errors:
            print(f"{path or '<embedded>'}: {problem}", file=sys.stderr)
        return 1
    for warning in warnings:
        print(f"{config.source}: warning: {warning}")
    print(f"{config.source}: OK ({len(config.listeners)} listeners, {len(config.upstreams)} upstreams, "
          f"{len(config.routes)} routes)")
    if too_many is not None:
        print(f"{config.source}: warning: {too_many}", file=sys.stderr)
    return 0
