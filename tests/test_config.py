"""Config loading: defaults, env expansion, and errors named by YAML path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.app.configure import load_config, parse_config
from gateway.config.address import Address
from gateway.config.node import ConfigError
from support import REPO


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(yaml.safe_load(text))
    return info.value.problems


def test_embedded_default_is_config_gateway_yaml() -> None:
    embedded = load_config(None)
    from_file = load_config(REPO / "config" / "gateway.yaml")
    assert embedded.listeners == from_file.listeners
    assert embedded.routes == from_file.routes
    rest = next(x for x in embedded.listeners if x.protocol == "v2-rest")
    assert rest.address == Address("0.0.0.0", 8000)
    assert embedded.admin.address == Address("127.0.0.1", 8002)
    assert embedded.limits.max_request_bytes >= 64 << 20


def test_env_expansion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_PORT", "9123")
    monkeypatch.delenv("GW_UNSET", raising=False)
    config = parse_config(yaml.safe_load("""
listeners:
  - {name: "rest$$1", protocol: v2-rest, address: "127.0.0.1:${GW_PORT}"}
  - {name: other, protocol: v2-rest, address: "${GW_UNSET:-127.0.0.1}:9124"}
upstreams: [{name: local, protocol: builtin}]
routes: [{upstream: local}]
"""))
    assert config.listeners[0].address.port == 9123
    assert config.listeners[0].name == "rest$1"
    assert config.listeners[1].address.host == "127.0.0.1"


def test_errors_name_yaml_paths() -> None:
    problems = _problems("""
limits: {max_request_bytes: lots}
listeners:
  - {name: rest, protocol: v2-rest, address: "localhost"}
  - {name: rest, protocol: carrier-pigeon, address: "127.0.0.1:1"}
upstreams:
  - {name: local, protocol: builtin, models: [simple, nope], colour: blue}
routes:
  - match: {model: {regex: "("}}
    upstream: local
  - match: {listener: nowhere, model: 5}
    upstream: missing
    timeout: soon
  - upstream: local
    extra: 1
    address: "${GW_DEFINITELY_UNSET}"
""")
    expected = [
        "limits.max_request_bytes: must be a size",
        "listeners[0].address: must be an address",
        "listeners[1].protocol: unknown frontend protocol 'carrier-pigeon'",
        "listeners[1]: duplicate listener name 'rest'",
        "upstreams[0].models[1]: unknown builtin model 'nope'",
        "upstreams[0].colour: unknown key",
        "routes[0].match.model: invalid regex",
        "routes[1].match.listener: names no listener",
        "routes[1].upstream: names no upstream",
        "routes[1].timeout: must be a duration",
        "routes[2].extra: unknown key",
        "routes[2].address: environment variable GW_DEFINITELY_UNSET is not set",
    ]
    for words in expected:
        assert any(p.startswith(words) for p in problems), (words, problems)


def test_missing_sections_are_reported() -> None:
    problems = _problems("admin: {address: '127.0.0.1:1'}\n")
    assert {"listeners: is required", "upstreams: is required", "routes: is required"} <= set(problems)
    assert _problems("- just a list") == ["<root>: the configuration must be a mapping"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def test_cli_check_and_routes(tmp_path: Path) -> None:
    ok = _cli("check", "--config", "config/gateway.yaml")
    assert ok.returncode == 0 and "OK" in ok.stdout
    routes = _cli("routes")
    assert routes.returncode == 0 and "model=* -> local" in routes.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("listeners: []\nupstreams: []\nroutes:\n  - upstream: nowhere\n")
    result = _cli("check", "--config", str(bad))
    assert result.returncode == 1
    assert "routes[0].upstream: names no upstream" in result.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("listeners: [\n")
    result = _cli("check", "--config", str(broken))
    assert result.returncode == 1 and "invalid YAML" in result.stderr
