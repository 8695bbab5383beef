"""`gateway check`: listeners on one address are an error (and `serve`
refuses the config), shadowed routes a warning, and `--format json` gives CI
one object with the same verdict and exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.app.check import finding, yaml_line
from gateway.app.configure import parse_config
from gateway.config.address import Address, addresses_overlap
from gateway.config.node import ConfigError
from support import REPO, write_config

UPSTREAMS = """
upstreams:
  - {name: local, protocol: builtin}
"""
SHADOWED = """
admin: {address: "127.0.0.1:0"}
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
""" + UPSTREAMS + """
routes:
  - name: everything
    upstream: local
  - name: resnet
    match: {model: resnet}
    upstream: local
"""


def listeners_config(*addresses: str, admin: str = "127.0.0.1:0") -> str:
    lines = "".join(f'  - {{name: l{i}, protocol: v2-rest, address: "{a}"}}\n' for i, a in enumerate(addresses))
    return f'admin: {{address: "{admin}"}}\nlisteners:\n{lines}{UPSTREAMS}routes:\n  - upstream: local\n'


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(yaml.safe_load(text))
    return caught.value.problems


def gateway(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("a, b, overlap", [
    ("127.0.0.1:8000", "127.0.0.1:8000", True),
    ("0.0.0.0:8000", "127.0.0.1:8000", True),
    ("10.1.2.3:8000", "0.0.0.0:8000", True),
    ("[::]:8000", "[::1]:8000", True),
    ("[::1]:8000", "[0:0:0:0:0:0:0:1]:8000", True),  # one address, two spellings
    ("LocalHost:8000", "localhost:8000", True),
    ("127.0.0.1:8000", "127.0.0.1:8001", False),
    ("127.0.0.1:8000", "127.0.0.2:8000", False),
    ("127.0.0.1:0", "127.0.0.1:0", False),  # each bind picks its own port
    ("0.0.0.0:8000", "[::1]:8000", False),  # other family
    ("[::]:8000", "127.0.0.1:8000", False),  # dual stack depends on the system: not claimed
    ("localhost:8000", "127.0.0.1:8000", False),  # names are not resolved
    ("localhost:8000", "0.0.0.0:8000", False),
])
def test_addresses_overlap(a: str, b: str, overlap: bool) -> None:
    def address(text: str) -> Address:
        host, port = text.rsplit(":", 1)
        return Address(host.strip("[]"), int(port))

    assert addresses_overlap(address(a), address(b)) is overlap
    assert addresses_overlap(address(b), address(a)) is overlap


def test_listeners_on_one_address_are_an_error_naming_both() -> None:
    found = problems(listeners_config("0.0.0.0:8000", "127.0.0.1:0", "127.0.0.1:8000"))
    assert found == ["listeners[2].address: listener 'l2' at 127.0.0.1:8000 overlaps listener 'l0' (listeners[0]) "
                     "at 0.0.0.0:8000; two sockets cannot serve one address"]
    found = problems(listeners_config("127.0.0.1:8002", admin="127.0.0.1:8002"))
    assert found == ["listeners[0].address: listener 'l0' at 127.0.0.1:8002 overlaps the admin server at "
                     "127.0.0.1:8002; two sockets cannot serve one address"]
    parse_config(yaml.safe_load(listeners_config("127.0.0.1:8000", "127.0.0.1:8001", "127.0.0.1:0", "127.0.0.1:0")))


def test_check_and_serve_refuse_listeners_on_one_address(tmp_path: Path) -> None:
    path = write_config(tmp_path, listeners_config("127.0.0.1:1", "[::]:2", "[::]:1", "127.0.0.1:1"))
    check = gateway("check", "--config", str(path))
    assert check.returncode == 1 and check.stdout == ""
    assert f"{path}: listeners[3].address: listener 'l3' at 127.0.0.1:1 overlaps listener 'l0'" in check.stderr
    # Refused before any bind (loopback only, should that ever break).
    path = write_config(tmp_path, listeners_config("127.0.0.1:1", "[::1]:2", "127.0.0.1:1"), "serve.yaml")
    serve = gateway("serve", "--config", str(path))
    assert serve.returncode == 1 and "listeners[2].address: listener 'l2'" in serve.stderr and "'l0'" in serve.stderr


def test_check_warns_about_a_shadowed_route(tmp_path: Path) -> None:
    path = write_config(tmp_path, SHADOWED)
    result = gateway("check", "--config", str(path))
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        f"{path}: warning: routes[1]: route 'resnet' never serves a request: the earlier route 'everything' "
        "(routes[0]) matches every request it matches (first match wins)",
        f"{path}: OK (1 listeners, 1 upstreams, 2 routes)",
    ]
    reordered = write_config(tmp_path, SHADOWED.replace("name: everything", "name: everything\n    match: {model: x}"),
                             "reachable.yaml")
    result = gateway("check", "--config", str(reordered))
    assert result.returncode == 0 and "warning" not in result.stdout + result.stderr


def check_json(path: Path) -> tuple[int, dict[str, Any]]:
    result = gateway("check", "--config", str(path), "--format", "json")
    return result.returncode, json.loads(result.stdout)


def test_json_report_of_a_good_config_with_a_warning(tmp_path: Path) -> None:
    path = write_config(tmp_path, SHADOWED)
    code, report = check_json(path)
    assert code == 0
    assert report == {
        "config": str(path), "ok": True, "errors": [],
        "warnings": [{"path": "routes[1]", "line": 12,
                      "message": "route 'resnet' never serves a request: the earlier route 'everything' "
                                 "(routes[0]) matches every request it matches (first match wins)"}],
        "listeners": 1, "upstreams": 1, "routes": 2,
    }
    code, report = check_json(REPO / "config" / "gateway.yaml")
    assert code == 0 and report["ok"] is True and report["errors"] == [] and report["routes"] >= 1


def test_json_report_of_errors(tmp_path: Path) -> None:
    path = write_config(tmp_path, listeners_config("127.0.0.1:1", "127.0.0.1:1")
                        + "  - {upstream: nowhere}\n  - {upstream: local, bogus: 1}\n")
    code, report = check_json(path)
    assert code == 1
    assert report["config"] == str(path) and report["ok"] is False and report["warnings"] == []
    assert report["listeners"] is None and report["upstreams"] is None and report["routes"] is None
    assert report["errors"] == [
        {"path": "listeners[1].address", "line": 4,
         "message": "listener 'l1' at 127.0.0.1:1 overlaps listener 'l0' (listeners[0]) at 127.0.0.1:1; "
                    "two sockets cannot serve one address"},
        {"path": "routes[1].upstream", "line": 10, "message": "names no upstream; known: local"},
        {"path": "routes[2].bogus", "line": 11, "message": "unknown key"},
    ]
    broken = write_config(tmp_path, "listeners: [\n", "broken.yaml")
    code, report = check_json(broken)
    assert code == 1 and report["ok"] is False
    [error] = report["errors"]
    assert error["path"] is None and error["line"] == 2 and "invalid YAML" in error["message"]


def test_finding_lines_follow_the_yaml_path() -> None:
    text = "listeners:\n  - name: a\n    address: x\nroutes:\n  - {upstream: u}\n  - match:\n      model: m\n"
    assert yaml_line(text, "listeners[0].address") == 3
    assert yaml_line(text, "routes[1].match.model") == 7
    assert yaml_line(text, "routes[1].upstream") == 6  # missing: its route
    assert yaml_line(text, "upstreams") == 1  # missing at the top: the document
    assert finding("routes[1].match.model: bad", text).line == 7
    assert finding("upstream 'u': circuit_breaker ...", text).path is None
