"""A real MLServer as a test peer: its own virtualenv, its own process.

MLServer pins much of its stack (FastAPI, pydantic, ...) and registers
``inference.*`` protobuf names, so it never shares the gateway's
environment: it lives in ``.test-peers/mlserver-venv`` (created once,
reused while its marker file names the same version) and runs as a
separate process bound to 127.0.0.1 on free ports, hosting every model in
``tests/peers/mlserver_models/`` (see the README there).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peers import venv_peer
from support import free_port, wait_for

MLSERVER_VERSION = "1.7.1"
MODELS_DIR = Path(__file__).resolve().parent / "mlserver_models"
MAX_MESSAGE_BYTES = 256 << 20  # MLServer's gRPC default (4 MiB) is too small for big tensors


def ensure_venv() -> Path:
    """The ``mlserver`` executable, installing it on first use."""
    return venv_peer.ensure_venv("mlserver", MLSERVER_VERSION) / "bin" / "mlserver"


def model_names() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.py") if not p.stem.startswith("_"))


def write_repository(root: Path, models: list[str], http_port: int, grpc_port: int, metrics_port: int,
                     host: str = "127.0.0.1") -> None:
    """MLServer's settings.json and one folder per model."""
    settings = {
        "host": host,
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_port": metrics_port,
        "metrics_dir": str(root / ".metrics"),
        "parallel_workers": 0,  # models in the server process: faster start, fewer processes
        "grpc_max_message_length": MAX_MESSAGE_BYTES,
        "debug": False,
    }
    (root / "settings.json").write_text(json.dumps(settings, indent=2))
    for name in models:
        model_settings: dict[str, Any] = {"name": name, "implementation": f"{name}.Model"}
        extra = MODELS_DIR / f"{name}.json"
        if extra.exists():
            model_settings.update(json.loads(extra.read_text()))
        folder = root / name
        folder.mkdir()
        (folder / "model-settings.json").write_text(json.dumps(model_settings, indent=2))


class MLServerPeer:
    """One MLServer process serving every test model over REST and gRPC."""

    def __init__(self, workdir: Path, models: list[str] | None = None, host: str = "127.0.0.1",
                 metrics_port: int = 0) -> None:
        self.workdir = workdir
        self.models = models or model_names()
        self.host = host  # a loopback address: peers on 127.0.0.1 and 127.0.0.2 may share a metrics port
        self.metrics_port = metrics_port  # 0: a free one
        self.proc: subprocess.Popen[bytes] | None = None
        self.http_port = self.grpc_port = 0

    @property
    def rest_address(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def log(self) -> str:
        path = self.workdir / "mlserver.log"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""

    def calls(self, model: str) -> list[dict[str, Any]]:
        """What ``model`` logged about each request it received, oldest
        first (models that call ``_shared.record``)."""
        path = self.workdir / model / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def start(self, timeout: float = 120.0) -> MLServerPeer:
        executable = ensure_venv()
        self.http_port, self.grpc_port = free_port(), free_port()
        self.metrics_port = self.metrics_port or free_port()
        write_repository(self.workdir, self.models, self.http_port, self.grpc_port, self.metrics_port, self.host)
        env = {**os.environ, "PYTHONPATH": str(MODELS_DIR)}
        with open(self.workdir / "mlserver.log", "wb") as log:
            # Own session: MLServer may start helper processes; stop() ends the group it leads.
            self.proc = subprocess.Popen([str(executable), "start", str(self.workdir)], cwd=self.workdir, env=env,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"MLServer exited with {self.proc.returncode}:\n{self.log()}")
            base = f"http://{self.rest_address}/v2"
            return venv_peer.http_status(f"{base}/health/ready") == 200 and all(
                venv_peer.http_status(f"{base}/models/{m}/ready") == 200 for m in self.models)

        try:
            wait_for(ready, timeout, "MLServer to load its models", interval=0.25)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        venv_peer.stop_group(proc)


@pytest.fixture(scope="session")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLServerPeer]:
    """One MLServer for the whole test session (it takes seconds to start)."""
    peer = MLServerPeer(tmp_path_factory.mktemp("mlserver")).start()
    try:
        yield peer
    finally:
        peer.stop()
