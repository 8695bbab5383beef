"""The configuration reference and examples cannot drift from the code:
every config dataclass field has a documented key with its real default,
and every example passes `gateway check`."""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gateway.app import cli
from gateway.config.address import Address
from gateway.config.node import Node
from gateway.config.routes import StringMatch
from gateway.config.schema import MODEL_MODULES
from support import REPO

DOC = REPO / "docs" / "configuration.md"
EXAMPLES = sorted((REPO / "config" / "examples").glob("*.yaml"))
# Fields that are no YAML key of their own.
NOT_KEYS = {
    ("GatewayConfig", "source"): "where the config was read from",
    ("ListenerConfig", "options"): "the protocol's own keys, documented per protocol",
    ("UpstreamConfig", "options"): "the protocol's own keys, documented per protocol",
    ("PolicyConfig", "kind"): "the policy's key beside `name`: the filter kind, documented per filter",
    ("PolicyConfig", "options"): "that key's value, documented per filter",
}
# Keys the YAML may omit although the dataclass field has no default.
YAML_DEFAULTS = {("RouteConfig", "match"): "{}"}
# Value types documented in prose, not as sections.
VALUE_TYPES = {"Address", "StringMatch"}


def config_dataclasses() -> dict[str, type]:
    return {name: obj for module in MODEL_MODULES for name, obj in vars(module).items()
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__
            and name not in VALUE_TYPES}


def documented_sections() -> dict[str, dict[str, str]]:
    """Class name -> {key: default cell} from the headings and tables of the doc."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in DOC.read_text().splitlines():
        heading = re.match(r"^#{2,4} .*— (\w+)\s*$", line)
        if heading:
            current = sections.setdefault(heading.group(1), {})
            continue
        if line.startswith("#"):
            current = None
        row = re.match(r"^\|\s*`([a-z_]+)`\s*\|[^|]*\|\s*([^|]*?)\s*\|", line)
        if row and current is not None:
            current[row.group(1)] = row.group(2)
    return sections


def _seconds(text: str) -> float | None:
    problems: list[str] = []
    value = Node({"v": text}, "", problems).duration("v", None)
    return None if problems else value


def default_matches(value: Any, cell: str) -> bool:
    """Whether a documented default cell says ``value``."""
    text = cell.replace("`", "").strip()
    if dataclasses.is_dataclass(value) and not isinstance(value, StringMatch | Address):
        return text == "see below"
    if value is None:
        return text == "null"
    if isinstance(value, bool):
        return text == str(value).lower()
    if isinstance(value, StringMatch):
        return text == value.describe()
    if isinstance(value, Address | str | enum.Enum):
        return text == (str(value) if value != "" else '""')
    if isinstance(value, int):
        return text.split()[0] == str(value)
    if isinstance(value, float):
        number = re.fullmatch(r"[\d.]+", text)
        seconds = float(text) if number else _seconds(text)
        return seconds is not None and abs(seconds - value) < 1e-9
    if isinstance(value, tuple | list | Mapping):
        inner = text.strip("[]{}")
        return ([x.strip() for x in inner.split(",")] if inner else []) == [str(v) for v in value]
    raise AssertionError(f"no rule for a default of type {type(value).__name__}")


def test_every_config_field_is_documented_with_its_default() -> None:
    sections = documented_sections()
    problems = []
    for name, cls in config_dataclasses().items():
        documented = sections.get(name)
        if documented is None:
            problems.append(f"{name}: no section '... — {name}' in {DOC.name}")
            continue
        keys = set()
        for field in dataclasses.fields(cls):
            if (name, field.name) in NOT_KEYS:
                continue
            keys.add(field.name)
            if field.name not in documented:
                problems.append(f"{name}.{field.name}: undocumented")
                continue
            cell = documented[field.name]
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                if not cell.startswith(f"`{YAML_DEFAULTS[name, field.name]}`" if (name, field.name) in YAML_DEFAULTS
                                       else "required"):
                    problems.append(f"{name}.{field.name}: has no default, the doc says {cell!r}")
                continue
            default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
            if not default_matches(default, cell):
                problems.append(f"{name}.{field.name}: default is {default!r}, the doc says {cell!r}")
        problems += [f"{name}.{key}: documented but not a field" for key in set(documented) - keys]
    assert not problems, "\n".join(problems)


def test_examples_exist_for_each_feature() -> None:
    names = {path.stem for path in EXAMPLES}
    assert {"routing", "canary-split", "retries-and-timeouts", "mirroring", "header-forwarding",
            "load-balancing", "health-and-outliers", "circuit-breaking", "kubernetes",
            # what users ask for
            "tls-and-mtls", "per-listener-auth", "umbridge-to-v2", "graphstorm-bridge",
            "tritonclient-to-mlserver", "v1-bridge"} <= names


def _with_certificates(example: Path, directory: Path) -> Path:
    """A copy of ``example`` beside the certificate files it names."""
    import trustme

    certs = directory / "certs"
    certs.mkdir()
    servers, clients, upstreams = trustme.CA(), trustme.CA(), trustme.CA()
    server = servers.issue_cert("localhost")
    server.cert_chain_pems[0].write_to_path(str(certs / "server.pem"))
    server.private_key_pem.write_to_path(str(certs / "server.key"))
    clients.cert_pem.write_to_path(str(certs / "clients-ca.pem"))
    upstreams.cert_pem.write_to_path(str(certs / "upstream-ca.pem"))
    gateway = clients.issue_cert("gateway")
    gateway.cert_chain_pems[0].write_to_path(str(certs / "gateway.pem"))
    gateway.private_key_pem.write_to_path(str(certs / "gateway.key"))
    copy = directory / example.name
    copy.write_text(example.read_text())
    return copy


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_passes_gateway_check(path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Each example as a user would run it: its token variables set and its
    certificate files present (made here, as a user brings their own)."""
    text = path.read_text()
    for variable in set(re.findall(r"(?:\{env: |api_key_env: )([A-Z_][A-Z0-9_]*)", text)):
        monkeypatch.setenv(variable, f"example-{variable.lower()}")
    if "certs/" in text:
        path = _with_certificates(path, tmp_path)
    code = cli.main(["check", "--config", str(path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "OK" in out.out
    text = path.read_text()
    assert text.lstrip().startswith("#"), "each example opens with a comment saying what it shows"
