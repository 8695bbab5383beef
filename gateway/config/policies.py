"""The `policies:` section and a route's `policies:` list.

A policy is a named, configured filter of the request cycle's filter chain
(gateway/dataplane/filters/): ``{name: per-key, rate_limit: {...}}`` names
the policy and, by its one other key, the filter kind with its options. A
route lists the policies its requests pass, in order. The config knows no
filter: the kinds and their option parsers come from a :class:`FilterCatalog`
handed in by the app (gateway/app/configure.py), as protocols do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gateway.config.node import Node


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    name: str
    kind: str  # the filter kind: its key in the YAML (rate_limit, response_cache, ...)
    options: Any  # what the kind's parse_options made of its value


class FilterCatalog(Protocol):
    """What the config asks of the filter registry."""

    def kinds(self) -> list[str]: ...

    def parse_options(self, kind: str, node: Node) -> Any: ...

    def options_schema(self, kind: str) -> dict[str, Any]: ...


def parse_policies(node: Node, catalog: FilterCatalog | None) -> tuple[PolicyConfig, ...]:
    kinds = catalog.kinds() if catalog is not None else []
    policies: list[PolicyConfig] = []
    seen: set[str] = set()
    for item in node.items():
        if not item.is_mapping:
            item.error("must be a mapping: {name: NAME, <kind>: {options}}")
            continue
        name = item.string("name")
        others = [key for key in item.value if key != "name"]
        if len(others) != 1:
            item.error(f"needs exactly one filter kind beside 'name' (one of: {', '.join(kinds) or 'none'}); "
                       f"got {len(others)}")
            continue
        kind = str(others[0])
        if kind not in kinds:
            item.error(f"unknown filter kind {kind!r}; known: {', '.join(kinds) or 'none'}", kind)
            continue
        assert catalog is not None
        options = catalog.parse_options(kind, item.child(kind))
        if not isinstance(name, str) or not name:
            continue
        if name in seen:
            item.error(f"a policy named {name!r} is defined twice", "name")
            continue
        seen.add(name)
        policies.append(PolicyConfig(name, kind, options))
    return tuple(policies)


def route_policies(node: Node, defined: set[str]) -> tuple[str, ...]:
    """A route's ``policies``: names of defined policies, each once, in the order they run."""
    names: list[str] = []
    for item in node.items():
        value = item.value
        if not isinstance(value, str) or not value:
            item.error("must be a policy name")
        elif value not in defined:
            item.error(f"no policy named {value!r} (policies:)")
        elif value in names:
            item.error(f"policy {value!r} is listed twice")
        else:
            names.append(value)
    return tuple(names)
