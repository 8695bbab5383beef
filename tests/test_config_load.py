"""Reading a config file: duplicate keys are errors with both line numbers,
and a value that is exactly ``${VAR}`` is typed after substitution."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.app.configure import load_config
from gateway.config.model import GatewayConfig
from gateway.config.node import ConfigError
from support import REPO

BASE = """\
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
upstreams:
  - name: local
    protocol: builtin
routes:
  - upstream: local
"""


def _load(tmp_path: Path, text: str) -> GatewayConfig:
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    return load_config(path)


def _problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    return info.value.problems


# --- duplicate keys -----------------------------------------------------------


def test_duplicate_top_level_key(tmp_path: Path) -> None:
    text = "limits:\n  max_connections: 10\n" + BASE + "limits:\n  max_connections: 20\n"
    assert _problems(tmp_path, text) == ["line 10: duplicate key 'limits' (first at line 1)"]


def test_duplicate_nested_key(tmp_path: Path) -> None:
    text = BASE + "drain:\n  delay: 1s\n  timeout: 5s\n  delay: 2s\n"
    assert _problems(tmp_path, text) == ["line 11: duplicate key 'delay' (first at line 9)"]


def test_duplicate_in_flow_mapping_names_columns(tmp_path: Path) -> None:
    text = BASE + "drain: {delay: 1s, delay: 2s}\n"
    assert _problems(tmp_path, text) == [
        "line 8, column 20: duplicate key 'delay' (first at line 8, column 9)"]


def test_duplicate_in_a_list_items_mapping_and_every_one_reported(tmp_path: Path) -> None:
    text = BASE.replace("    protocol: builtin\n", "    protocol: builtin\n    name: other\n")
    text += "listeners: []\n"
    assert sorted(_problems(tmp_path, text)) == [
        "line 6: duplicate key 'name' (first at line 4)",
        "line 9: duplicate key 'listeners' (first at line 1)",
    ]


def test_merge_keys_may_still_override(tmp_path: Path) -> None:
    text = BASE + "x-drain: &drain {delay: 1s, timeout: 5s}\ndrain:\n  <<: *drain\n  delay: 2s\n"
    with pytest.raises(ConfigError) as info:  # x-drain is an unknown key, but no duplicate
        _load(tmp_path, text)
    assert info.value.problems == ["x-drain: unknown key"]


def test_cli_check_names_file_and_lines(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(BASE + "drain:\n  timeout: 5s\n  timeout: 6s\n")
    result = subprocess.run([sys.executable, "-m", "gateway", "check", "--config", str(path)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"{path}: line 10: duplicate key 'timeout' (first at line 9)" in result.stderr


# --- typed substitution -------------------------------------------------------

TYPED = BASE + """\
limits:
  max_connections: ${GW_T_CONNS}
  max_request_bytes: ${GW_T_SIZE}
  max_inflight_bytes: ${GW_T_BYTES}
observability:
  tracing: {enabled: "${GW_T_ON}", sample_ratio: "${GW_T_RATIO}"}
"""


def test_exact_reference_is_typed_as_yaml_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"GW_T_CONNS": "12", "GW_T_SIZE": "64MiB", "GW_T_BYTES": "134217728",
                        "GW_T_ON": "true", "GW_T_RATIO": "0.25", "GW_T_NUM": "42"}.items():
        monkeypatch.setenv(name, value)
    # A string field takes the text even when it reads as a number.
    config = _load(tmp_path, TYPED.replace("name: local", "name: ${GW_T_NUM}").replace("upstream: local",
                                                                                      'upstream: "${GW_T_NUM}"'))
    assert config.upstreams[0].name == "42" and config.routes[0].upstream == "42"
    assert config.limits.max_connections == 12
    assert config.limits.max_request_bytes == 64 << 20
    assert config.limits.max_inflight_bytes == 128 << 20
    assert config.observability.tracing.enabled is True
    assert config.observability.tracing.sample_ratio == 0.25


def test_defaults_are_typed_and_used_when_unset_or_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GW_T_UNSET", raising=False)
    monkeypatch.setenv("GW_T_EMPTY", "")
    config = _load(tmp_path, BASE + """\
limits:
  max_connections: ${GW_T_UNSET:-70}
  max_headers: ${GW_T_EMPTY:-9}
  max_request_bytes: ${GW_T_EMPTY:-1KiB}
admin:
  address: ${GW_T_UNSET:-null}
observability:
  tracing: {enabled: "${GW_T_EMPTY:-yes}", sample_ratio: "${GW_T_UNSET:-1}"}
""")
    assert config.limits.max_connections == 70
    assert config.limits.max_headers == 9
    assert config.limits.max_request_bytes == 1024
    assert config.admin.address is None
    assert config.observability.tracing.enabled is True
    assert config.observability.tracing.sample_ratio == 1.0


def test_unset_without_default_names_the_variable_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GW_T_CONNS", raising=False)
    monkeypatch.setenv("GW_T_SIZE", "secret-value")
    for name, value in {"GW_T_BYTES": "1GiB", "GW_T_ON": "false", "GW_T_RATIO": "1"}.items():
        monkeypatch.setenv(name, value)
    problems = _problems(tmp_path, TYPED)
    assert problems[0] == "limits.max_connections: environment variable GW_T_CONNS is not set"
    assert len(problems) == 2 and problems[1].startswith("limits.max_request_bytes: must be a size")
    assert "secret-value" not in problems[1] and "'${GW_T_SIZE}'" in problems[1]


def test_errors_show_substituted_strings_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_T_SECRET", "hunter2")
    problems = _problems(tmp_path, BASE.replace("v2-rest", '"${GW_T_SECRET}"').replace(
        '"127.0.0.1:0"', '"${GW_T_SECRET}"'))
    assert not any("hunter2" in p for p in problems), problems
    assert any(p.startswith("listeners[0].protocol: unknown frontend protocol '${GW_T_SECRET}'") for p in problems)
