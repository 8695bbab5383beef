"""The published JSON Schema of the config (`gateway schema`) accepts every
shipped config, refuses what the gateway refuses, and covers every field of
the config dataclasses, so it cannot drift from the code."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from test_config_docs import NOT_KEYS, YAML_DEFAULTS

from gateway.app import configure
from gateway.config import schema
from gateway.config.address import Address
from gateway.config.model import GatewayConfig
from gateway.config.node import ConfigError
from gateway.config.routes import StringMatch
from support import REPO

SHIPPED = [*sorted((REPO / "config" / "examples").glob("*.yaml")),
           REPO / "config" / "gateway.yaml", REPO / "gateway" / "config" / "default.yaml"]
MINIMAL = {"listeners": [{"name": "rest", "protocol": "v2-rest", "address": "127.0.0.1:8000"}],
           "upstreams": [{"name": "models", "protocol": "v2-rest", "endpoints": ["127.0.0.1:9000"]}],
           "routes": [{"match": {"model": "*"}, "upstream": "models"}]}


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    built = configure.build_schema()
    jsonschema.Draft202012Validator.check_schema(built)
    return jsonschema.Draft202012Validator(built)


def _problems(validator: jsonschema.protocols.Validator, data: Any) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(data)]


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_configs_validate(path: Path, validator: jsonschema.protocols.Validator) -> None:
    assert _problems(validator, yaml.safe_load(path.read_text())) == []


def test_a_minimal_config_validates(validator: jsonschema.protocols.Validator) -> None:
    assert _problems(validator, MINIMAL) == []
    configure.parse_config(MINIMAL)  # and the gateway takes it: the invalid cases below differ in one thing


def _changed(edit: Any) -> Any:
    data = copy.deepcopy(MINIMAL)
    edit(data)
    return data


@pytest.mark.parametrize(("what", "edit"), [
    ("an unknown top-level key", lambda d: d.update(listners=[])),
    ("an unknown key in a section", lambda d: d.update(limits={"max_conections": 10})),
    ("an unknown key in a route", lambda d: d["routes"][0].update(retyr={"attempts": 2})),
    ("a wrong type", lambda d: d.update(limits={"max_connections": "many"})),
    ("a port as a number", lambda d: d["listeners"][0].update(address=8000)),
    ("a boolean duration", lambda d: d.update(drain={"timeout": True})),
    ("a malformed size", lambda d: d.update(limits={"max_request_bytes": "64MB"})),
    ("an unknown choice", lambda d: d.update(readiness={"upstreams": "most"})),
    ("an unknown protocol", lambda d: d["listeners"][0].update(protocol="v3-rest")),
    ("a route with upstream and split", lambda d: d["routes"][0].update(split=[{"upstream": "models", "weight": 100}])),
    ("a missing required key", lambda d: d["listeners"][0].pop("address")),
    ("a token written in the config", lambda d: d["listeners"][0].update(auth={"token": "s3cret"})),
])
def test_invalid_configs_fail(what: str, edit: Any, validator: jsonschema.protocols.Validator) -> None:
    """The schema refuses what the gateway refuses."""
    data = _changed(edit)
    assert _problems(validator, data), what
    with pytest.raises(ConfigError):
        configure.parse_config(data)


def test_protocol_keys_and_the_yaml_forms_validate(validator: jsonschema.protocols.Validator, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Each YAML form the parsers take (and the gateway takes this file too)."""
    def edit(d: Any) -> None:
        d["upstreams"][0].update(binary="always")  # a protocol's own key: allowed, not described
        d["upstreams"][0].update(timeout="2.5s", load_balancing="least_request",
                                 health_check={"interval": "500ms"}, auth={"token": {"env": "TOKEN"}})
        d["routes"][0].update(match={"model": {"regex": "^m.*"}, "version": 1, "headers": {"x-a": {"present": True}}},
                              mirror={"upstream": "models", "percent": 5}, retry={"backoff": 0.1})
        d.update(limits={"max_inflight_bytes": "1GiB", "idle_timeout": "${IDLE:-75s}"}, admin={"address": None},
                 classification={"labels": {"m": "labels.txt", "n": {"out": "n.txt"}}})
    data = _changed(edit)
    assert _problems(validator, data) == []
    for name in ("labels.txt", "n.txt"):
        (tmp_path / name).write_text("cat\ndog\n")
    monkeypatch.setenv("TOKEN", "t0ken")
    configure.parse_config(data, base_dir=tmp_path)


def _reachable_dataclasses() -> dict[str, type]:
    found: dict[str, type] = {}
    todo: list[Any] = [GatewayConfig]
    while todo:
        hint = todo.pop()
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if hint.__name__ in found or hint in (Address, StringMatch):
                continue
            found[hint.__name__] = hint
            todo += typing.get_type_hints(hint).values()
        else:
            todo += typing.get_args(hint)
    return found


def test_the_schema_covers_every_field() -> None:
    built = configure.build_schema()
    sections = _reachable_dataclasses()
    assert {"GatewayConfig", "RouteMatch", "SecretRef", "ListenerTls", "ClassificationConfig"} <= set(sections)
    problems = []
    for name, cls in sections.items():
        section = built if name == "GatewayConfig" else built["$defs"].get(name)
        if section is None:
            problems.append(f"{name}: no definition")
            continue
        keys = {f.name for f in dataclasses.fields(cls) if (name, f.name) not in schema.NOT_KEYS}
        if set(section["properties"]) != keys:
            problems.append(f"{name}: properties {sorted(section['properties'])}, fields {sorted(keys)}")
    assert not problems, "\n".join(problems)


def test_the_rules_name_real_fields_and_agree_with_the_docs_test() -> None:
    assert schema.NOT_KEYS == set(NOT_KEYS)
    assert set(YAML_DEFAULTS) <= schema.YAML_OPTIONAL
    fields = {(name, f.name) for name, cls in _reachable_dataclasses().items() for f in dataclasses.fields(cls)}
    tables = (schema.NOT_KEYS | schema.YAML_OPTIONAL | schema.DURATIONS | schema.NUMBERS | schema.SIZES
              | set(schema.CHOICES) | set(schema.SPECIAL) | set(schema.DESCRIPTIONS))
    assert tables - fields == set(), "rules for fields that do not exist"
    assert set(schema.SECTION_RULES) <= {name for name, _ in fields}


def test_defaults_validate_against_their_own_schema() -> None:
    built = configure.build_schema()
    problems = []
    for name, section in [("<root>", built), *built["$defs"].items()]:
        for key, prop in section.get("properties", {}).items():
            if "default" in prop:
                checker = jsonschema.Draft202012Validator({**prop, "$defs": built["$defs"]})
                problems += [f"{name}.{key}: {e.message}" for e in checker.iter_errors(prop["default"])]
    assert not problems, "\n".join(problems)


def test_gateway_schema_prints_the_schema_as_json() -> None:
    out = subprocess.run([sys.executable, "-m", "gateway", "schema"], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert json.loads(out) == configure.build_schema()
