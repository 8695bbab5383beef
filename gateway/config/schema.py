"""A JSON Schema (draft 2020-12) of the YAML config, for editors.

Built from the config dataclasses (gateway/config/model.py and the sections it
nests), so a new field appears here without anyone editing this module. YAML
keys are the dataclass field names; what a type hint cannot say (a float that
is a duration, an int that is a size, a string with fixed choices, a field
whose YAML form differs from its parsed form) is in the tables below, and a
float field in none of them stops the build, so it cannot be missed.

The gateway's own check (`gateway check`) stays the authority: the schema is
what an editor can tell while typing. Protocol keys of a listener or an
upstream are allowed but not described here (each protocol's parse_options
reads them).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.config import address, limits, listeners, model, observability, policies, redis, routes, server, upstreams
from gateway.config.address import Address
from gateway.config.catalog import ProtocolCatalog
from gateway.config.extensions import GATEWAY_EXTENSIONS
from gateway.config.model import GatewayConfig
from gateway.config.policies import FilterCatalog
from gateway.config.redis import ON_ERROR
from gateway.config.routes import RETRY_ON, StringMatch
from gateway.config.server import READINESS_MODES
from gateway.config.tls import CLIENT_AUTH_MODES
from gateway.config.upstreams import DNS_FAMILIES, LOAD_BALANCING_POLICIES, LOAD_METRICS_PRESETS

# The modules of the config model: the document and its sections.
MODEL_MODULES = (model, address, limits, listeners, upstreams, routes, server, observability, policies, redis)

Json = dict[str, Any]

# Fields that are no YAML key of their own (tests/test_config_docs.py: NOT_KEYS).
NOT_KEYS = {("GatewayConfig", "source"), ("ListenerConfig", "options"), ("UpstreamConfig", "options"),
            ("PolicyConfig", "kind"), ("PolicyConfig", "options")}
# Sections that also take the keys of their protocol (read by its parse_options).
PROTOCOL_KEYS = {"ListenerConfig", "UpstreamConfig"}
# Keys the YAML may omit although the field has no default.
YAML_OPTIONAL = {("RouteConfig", "match"), ("RouteConfig", "upstream")}
# Floats read by Node.duration (seconds, or "250ms", "30s", "2m", "1h") ...
DURATIONS = {
    ("Limits", "idle_timeout"), ("Limits", "body_timeout"),
    ("HealthCheck", "interval"), ("HealthCheck", "timeout"),
    ("OutlierDetection", "base_ejection_time"), ("OutlierDetection", "max_ejection_time"),
    ("UpstreamConfig", "timeout"), ("RouteConfig", "timeout"),
    ("RetryPolicy", "per_try_timeout"), ("RetryPolicy", "backoff"), ("RetryPolicy", "max_backoff"),
    ("DrainConfig", "delay"), ("DrainConfig", "timeout"), ("ReloadConfig", "watch_interval"),
    ("SequenceAffinity", "idle_timeout"), ("RedisConfig", "timeout"),
    ("DnsDiscovery", "refresh"), ("DnsDiscovery", "timeout"), ("DnsDiscovery", "reconnect"),
    ("LoadMetrics", "interval"), ("LoadMetrics", "timeout"), ("LoadMetrics", "stale_after"),
}
# ... and floats that are plain numbers. Every float field is in one of the two.
NUMBERS = {("RetryBudget", "percent"), ("Mirror", "percent"), ("TracingConfig", "sample_ratio"),
           ("BatchingConfig", "max_delay_ms")}
# Ints read by Node.size (bytes, or "512KiB", "64MiB", "1GiB").
SIZES = {("Limits", name) for name in ("max_request_bytes", "max_request_tensor_bytes", "max_bytes_element",
                                      "max_header_line_bytes", "max_grpc_metadata_bytes", "max_inflight_bytes")}
# Strings (or list items) with fixed choices.
CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("LoadBalancing", "policy"): LOAD_BALANCING_POLICIES,
    ("ReadinessConfig", "upstreams"): READINESS_MODES,
    ("AccessLogConfig", "format"): ("plain", "json"),
    ("ListenerTls", "client_auth"): CLIENT_AUTH_MODES,
    ("RetryPolicy", "retry_on"): RETRY_ON,
    ("ServerIdentity", "extensions"): GATEWAY_EXTENSIONS,
    ("DnsDiscovery", "family"): DNS_FAMILIES,
    ("LoadMetrics", "preset"): tuple(LOAD_METRICS_PRESETS),
    ("RedisConfig", "on_error"): ON_ERROR,
}
# Whole-section rules a field list cannot say.
SECTION_RULES: dict[str, Json] = {
    "SecretRef": {"minProperties": 1, "maxProperties": 1},  # {file: PATH} or {env: VARIABLE}
    "RouteConfig": {"oneOf": [{"required": ["upstream"]}, {"required": ["split"]}]},
    "LoadMetrics": {"oneOf": [{"required": ["preset"]}, {"required": ["gauge"]}]},
}

ENV_REFERENCE: Json = {"type": "string", "pattern": r"\$\{", "description": "expanded from the environment"}
DEFS: Json = {
    "EnvReference": ENV_REFERENCE,
    "Address": {"anyOf": [{"type": "string", "pattern": r"^\s*(\[[0-9a-fA-F:.]+\]|[^:\[\]/\s]+):[0-9]{1,5}\s*$"},
                          {"$ref": "#/$defs/EnvReference"}],
                "description": "host:port ([v6-address]:port for IPv6)"},
    "Duration": {"anyOf": [{"type": "number", "minimum": 0},
                           {"type": "string", "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*(ms|s|m|h)?\s*$"},
                           {"$ref": "#/$defs/EnvReference"}],
                 "description": "seconds, or a duration like 250ms, 30s, 2m, 1h"},
    "Size": {"anyOf": [{"type": "integer", "minimum": 0},
                       {"type": "string", "pattern": r"^\s*[0-9]+\s*(B|KiB|MiB|GiB)?\s*$"},
                       {"$ref": "#/$defs/EnvReference"}],
             "description": "bytes, or a size like 512KiB, 64MiB, 1GiB"},
    "StringMatch": {"anyOf": [{"type": ["string", "integer"]},
                              {"type": "object", "minProperties": 1, "maxProperties": 1,
                               "additionalProperties": False,
                               "properties": {k: {"type": "string"} for k in ("exact", "glob", "regex")}}],
                    "description": "a name (exact, or a glob with * ? [..]), {exact: S}, {glob: S} or {regex: S}"},
    # {name: NAME, <kind>: {options}}: the kind's key is the filter registry's (gateway/config/policies.py).
    "PolicyConfig": {"type": "object", "required": ["name"], "minProperties": 2, "maxProperties": 2,
                     "properties": {"name": {"type": "string"}}, "additionalProperties": {"type": ["object", "null"]},
                     "description": "a policy: its name and one filter kind with its options"},
    "HeaderMatch": {"anyOf": [{"$ref": "#/$defs/StringMatch"},
                              {"type": "object", "properties": {"present": {"const": True}},
                               "required": ["present"], "additionalProperties": False}],
                    "description": "as StringMatch, or {present: true}"},
}
# Fields whose YAML form is not their parsed type.
SPECIAL: dict[tuple[str, str], Json] = {
    ("RouteMatch", "headers"): {"type": "object", "additionalProperties": {"$ref": "#/$defs/HeaderMatch"},
                                "description": "header name -> how its value is matched"},
    ("UpstreamConfig", "load_balancing"): {"anyOf": [
        {"enum": [p for p in LOAD_BALANCING_POLICIES if p != "consistent_hash"]},
        {"$ref": "#/$defs/LoadBalancing"}]},
    ("RouteConfig", "mirror"): {"anyOf": [{"$ref": "#/$defs/Mirror"},
                                          {"type": "array", "items": {"$ref": "#/$defs/Mirror"}}]},
    ("GatewayConfig", "policies"): {"type": "array", "items": {"$ref": "#/$defs/PolicyConfig"},
                                    "description": "named filters routes list"},
    ("RedisConfig", "address"): {"$ref": "#/$defs/Address"},
    ("ClassificationConfig", "labels"): {
        "type": "object", "description": "model -> label file, or output name -> label file",
        "additionalProperties": {"anyOf": [{"type": "string"},
                                           {"type": "object", "additionalProperties": {"type": "string"}}]}},
}
# Where a field's source comment speaks of the parsed value, not the YAML.
DESCRIPTIONS = {
    ("RouteConfig", "upstream"): "the upstream's name; a route has either upstream or split",
    ("UpstreamConfig", "health_check"): "active health checks; absent or null: none",
}
_SIMPLE = {str: {"type": "string"}, Path: {"type": "string"}, bool: {"type": "boolean"},
           int: {"type": "integer"}, float: {"type": "number"}}
_VALUE_TYPES = {Address: "Address", StringMatch: "StringMatch"}


def build_schema(registry: ProtocolCatalog, filters: FilterCatalog | None = None) -> Json:
    """The schema of a whole config file (GatewayConfig at the root); the
    protocol names are ``registry``'s (the app hands in gateway.protocols.registry),
    the policies' filter kinds and their options ``filters``'."""
    defs: Json = dict(DEFS)
    if filters is not None:  # each kind's options as its filter describes them; no other kind
        kinds = {f"^{re.escape(kind)}$": filters.options_schema(kind) for kind in filters.kinds()}
        defs["PolicyConfig"] = {**DEFS["PolicyConfig"], "patternProperties": kinds, "additionalProperties": False}
    protocols = {("ListenerConfig", "protocol"): tuple(registry.names("frontend")),
                 ("UpstreamConfig", "protocol"): tuple(registry.names("backend"))}
    root = _section(GatewayConfig, defs, {**CHOICES, **protocols})
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "inference-gateway configuration",
            **root, "$defs": defs}


def _section(cls: type, defs: Json, choices: Mapping[tuple[str, str], tuple[str, ...]]) -> Json:
    name = cls.__name__
    hints = typing.get_type_hints(cls)
    comments = _field_comments(cls)
    properties: Json = {}
    required = []
    for field in dataclasses.fields(cls):
        key = (name, field.name)
        if key in NOT_KEYS:
            continue
        default = _default(field)
        if default is dataclasses.MISSING and key not in YAML_OPTIONAL:
            required.append(field.name)
        schema = _field_schema(key, hints[field.name], defs, choices)
        if default is not dataclasses.MISSING and key not in SPECIAL:
            if not dataclasses.is_dataclass(default) or isinstance(default, tuple(_VALUE_TYPES)):
                schema["default"] = _json_value(default)
        description = DESCRIPTIONS.get(key) or schema.get("description") or comments.get(field.name)
        if description:
            schema["description"] = description
        properties[field.name] = schema
    section: Json = {"type": "object"}
    doc = inspect.getdoc(cls)
    if doc and not doc.startswith(f"{name}("):  # not the signature dataclass makes up
        section["description"] = " ".join(doc.replace("``", "`").split())
    section["properties"] = properties
    if required:
        section["required"] = required
    if name in PROTOCOL_KEYS:
        section["$comment"] = "also the keys of its protocol (docs/configuration.md, Protocol keys)"
        section["additionalProperties"] = True
    else:
        section["additionalProperties"] = False  # unknown keys are errors in the gateway too
    section.update(SECTION_RULES.get(name, {}))
    return section


def _field_schema(key: tuple[str, str], hint: Any, defs: Json,
                  choices: Mapping[tuple[str, str], tuple[str, ...]]) -> Json:
    if key in SPECIAL:
        return _with_sections(SPECIAL[key], defs, choices)
    optional, hint = _unwrap_optional(hint)
    if hint is float and key not in DURATIONS | NUMBERS:
        raise TypeError(f"{key[0]}.{key[1]}: a float field needs a rule: add it to DURATIONS or NUMBERS")
    if key in DURATIONS:
        schema: Json = {"$ref": "#/$defs/Duration"}
    elif key in SIZES:
        schema = {"$ref": "#/$defs/Size"}
    elif key in choices:
        enum: Json = {"anyOf": [{"enum": list(choices[key])}, {"$ref": "#/$defs/EnvReference"}]}
        schema = {"type": "array", "items": enum} if typing.get_origin(hint) is tuple else enum
    else:
        schema = _type_schema(hint, defs, choices, f"{key[0]}.{key[1]}")
    return {"anyOf": [schema, {"type": "null"}]} if optional else schema


def _type_schema(hint: Any, defs: Json, choices: Mapping[tuple[str, str], tuple[str, ...]], where: str) -> Json:
    optional, hint = _unwrap_optional(hint)
    if optional:
        return {"anyOf": [_type_schema(hint, defs, choices, where), {"type": "null"}]}
    if hint in _SIMPLE:
        return dict(_SIMPLE[hint])
    if hint in _VALUE_TYPES:
        return {"$ref": f"#/$defs/{_VALUE_TYPES[hint]}"}
    if hint is Any:
        return {}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if hint.__name__ not in defs:
            defs[hint.__name__] = {}  # reserved first: a section may nest itself
            defs[hint.__name__] = _section(hint, defs, choices)
        return {"$ref": f"#/$defs/{hint.__name__}"}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (tuple, list) and (origin is list or (len(args) == 2 and args[1] is Ellipsis)):
        return {"type": "array", "items": _type_schema(args[0], defs, choices, where)}
    if origin in (dict, Mapping) and args[0] is str:
        return {"type": "object", "additionalProperties": _type_schema(args[1], defs, choices, where)}
    raise TypeError(f"{where}: no JSON Schema rule for {hint!r}")


def _with_sections(schema: Json, defs: Json, choices: Mapping[tuple[str, str], tuple[str, ...]]) -> Json:
    """``schema`` after defining the sections its ``$ref``s name."""
    for name in re.findall(r"#/\$defs/(\w+)", repr(schema)):
        if name not in defs:
            _type_schema(_dataclass_named(name), defs, choices, name)
    return dict(schema)


def _dataclass_named(name: str) -> type:
    """The config dataclass a ``$ref`` of the tables above names."""
    return next(getattr(module, name) for module in MODEL_MODULES if hasattr(module, name))  # type: ignore[no-any-return]


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default  # MISSING when there is none


def _unwrap_optional(hint: Any) -> tuple[bool, Any]:
    """(whether ``hint`` admits None, the hint without it)."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return False, hint
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) != 1:
        raise TypeError(f"no JSON Schema rule for the union {hint!r}")
    return len(args) < len(typing.get_args(hint)), args[0]


def _json_value(value: Any) -> Any:
    if isinstance(value, StringMatch):
        return value.describe()
    if isinstance(value, Address):
        return str(value)
    if isinstance(value, tuple | list):
        return [_json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    return value


_FIELD = re.compile(r"^    (\w+):[^#]*?(?:\s+#\s*(.*))?$")
_COMMENT = re.compile(r"^    #\s?(.*)$")


def _field_comments(cls: type) -> dict[str, str]:
    """Field name -> its comment in the source (trailing, else the comment
    lines just above it): the descriptions people wrote for each field."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):  # no source (a frozen build): no descriptions
        return {}
    comments: dict[str, str] = {}
    above: list[str] = []
    for line in lines[1:]:
        comment = _COMMENT.match(line)
        if comment:
            above.append(comment.group(1).strip())
            continue
        field = _FIELD.match(line)
        if field and not line.lstrip().startswith(("def ", "@")):
            text = field.group(2) or " ".join(above)
            if text:
                comments[field.group(1)] = text
        above = []
    return comments
