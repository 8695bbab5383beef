"""`make run` installs the runtime only: the gateway must start
and serve every protocol without any package of the test extras. The
gateway runs here with an import hook that refuses those packages, so a
runtime import of one (say, a helper that pulls in tritonclient) fails this
test instead of a user's `make run`.

The Makefile half is checked too: `make run` installs `.` and `make test`
adds `.[test]` (read with `make -n`, nothing is installed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import REPO, GatewayProcess, write_config

# Top-level modules of the test extras' packages (pyproject.toml [test]).
TEST_ONLY = ("tritonclient", "pytest", "hypothesis", "atheris", "schemathesis", "umbridge", "requests",
             "jsonschema", "grpc_tools", "kubernetes_validate", "trustme", "mypy", "ruff", "geventhttpclient")

HOOK = """
import sys

BLOCKED = {blocked!r}


class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} belongs to the test extras, not the runtime")
        return None


sys.meta_path.insert(0, _Refuse())
"""

CONFIG = """
admin: {address: "127.0.0.1:0"}
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
  - {name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}
  - {name: umbridge, protocol: umbridge, address: "127.0.0.1:0"}
  - {name: gs, protocol: graphstorm, address: "127.0.0.1:0"}
upstreams:
  - {name: local, protocol: builtin}
routes:
  - match: {model: "*"}
    upstream: local
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("runtime")
    hook = directory / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK.format(blocked=set(TEST_ONLY)))
    with GatewayProcess(write_config(directory, CONFIG), directory / "gateway.log",
                        {"PYTHONPATH": str(hook)}) as gw:
        yield gw


def post(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        answer: dict[str, object] = json.loads(reply.read())
        return answer


def test_the_hook_refuses_what_it_should(tmp_path: Path) -> None:
    """The hook works in the gateway's interpreter (where tritonclient is
    installed): without this, the test below could pass blindly."""
    (tmp_path / "sitecustomize.py").write_text(HOOK.format(blocked=set(TEST_ONLY)))
    result = subprocess.run([sys.executable, "-c", "import tritonclient"],
                            env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True)
    assert result.returncode != 0 and b"test extras" in result.stderr


def test_every_protocol_serves_without_the_test_extras(gateway: GatewayProcess) -> None:
    rest = post(f"http://{gateway.url('rest')}/v2/models/identity/infer",
                {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]})
    assert rest["outputs"][0]["data"] == [1, 2]  # type: ignore[index]
    umbridge = post(f"http://{gateway.url('umbridge')}/Evaluate", {"name": "forward", "input": [[0.1, 0.2], [0.3]]})
    assert "output" in umbridge
    with urllib.request.urlopen(f"http://{gateway.url('gs')}/ping", timeout=10) as reply:
        assert reply.status == 200
    import grpc

    with grpc.insecure_channel(gateway.url("grpc")) as channel:
        live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")(b"", timeout=10)
    assert live == b"\x08\x01"  # ServerLiveResponse{live: true}
    assert "belongs to the test extras" not in gateway.log()


def test_make_run_installs_the_runtime_and_make_test_the_extras() -> None:
    dry = subprocess.run(["make", "-n", "-B", "run", "test"], cwd=REPO, capture_output=True, text=True, check=True)
    installs = [line for line in dry.stdout.splitlines() if "pip install" in line and "-e" in line]
    assert installs[0].rstrip().endswith("-e ."), installs  # run: the runtime alone
    assert any("'.[test]'" in line for line in installs[1:]), installs  # test: the extras added
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    runtime = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not {_name(r) for r in extras} & {_name(r) for r in runtime}


def _name(requirement: str) -> str:
    return requirement.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()
