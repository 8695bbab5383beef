"""A real KServe V1 model server as a test peer: its own virtualenv, its
own process.

The ``kserve`` package pins its own FastAPI/uvicorn/protobuf stack, so it
never shares the gateway's environment: it lives in
``.test-peers/kserve-venv`` (created on first use, under a file lock, and
reused while its marker file names the same version; the install took 27 s
here) and runs ``kserve_models/serve.py`` as a separate process on a free
127.0.0.1 port, serving the custom ``kserve.Model``s of
``kserve_models/models.py`` over KServe's V1 REST protocol.
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

KSERVE_VERSION = "0.21.0"
MODELS_DIR = Path(__file__).resolve().parent / "kserve_models"
MODELS = ("doubler", "summer", "labeller", "echo", "broken")  # those that answer ready


def ensure_venv() -> Path:
    """The virtualenv's python, installing kserve on first use."""
    return venv_peer.ensure_venv("kserve", KSERVE_VERSION) / "bin" / "python"


class KServePeer:
    """One KServe ModelServer process serving the V1 test models."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.http_port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def log(self) -> str:
        path = self.workdir / "kserve.log"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""

    def echo_calls(self) -> list[dict[str, Any]]:
        """The bodies the ``echo`` model received, oldest first."""
        path = self.workdir / "echo-calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def start(self, timeout: float = 120.0) -> KServePeer:
        python = ensure_venv()
        self.http_port = free_port()
        with open(self.workdir / "kserve.log", "wb") as log:
            # Own session: stop() ends the group it leads, helpers included.
            self.proc = subprocess.Popen([str(python), "serve.py", "--http_port", str(self.http_port)],
                                         cwd=MODELS_DIR, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "KSERVE_CALLS": str(self.workdir / "echo-calls.jsonl")},
                                         start_new_session=True)

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"KServe exited with {self.proc.returncode}:\n{self.log()}")
            return venv_peer.http_status(f"http://{self.address}/") == 200 and all(
                venv_peer.http_status(f"http://{self.address}/v1/models/{m}") == 200 for m in MODELS)

        try:
            wait_for(ready, timeout, "KServe to load its models", interval=0.25)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        venv_peer.stop_group(proc)


@pytest.fixture(scope="session")
def kserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KServePeer]:
    """One KServe V1 server for the whole test session."""
    peer = KServePeer(tmp_path_factory.mktemp("kserve")).start()
    try:
        yield peer
    finally:
        peer.stop()
