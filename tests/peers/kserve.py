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

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import REPO, free_port, wait_for

KSERVE_VERSION = "0.21.0"
PEERS_DIR = REPO / ".test-peers"
VENV = PEERS_DIR / "kserve-venv"
MODELS_DIR = Path(__file__).resolve().parent / "kserve_models"
MODELS = ("doubler", "summer", "labeller", "echo", "broken")  # those that answer ready
INSTALL_TIMEOUT = 900.0


def ensure_venv() -> Path:
    """The virtualenv's python, installing kserve on first use."""
    python = VENV / "bin" / "python"
    marker = VENV / f".installed-kserve-{KSERVE_VERSION}"
    if marker.exists():
        return python
    PEERS_DIR.mkdir(exist_ok=True)
    with open(PEERS_DIR / "kserve-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test run may be installing it right now
        if not marker.exists():
            shutil.rmtree(VENV, ignore_errors=True)  # a half-made venv from an interrupted run
            _run([sys.executable, "-m", "venv", str(VENV)], 120)
            _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                  f"kserve=={KSERVE_VERSION}"], INSTALL_TIMEOUT)
            marker.write_text(KSERVE_VERSION)
    return python


def _run(command: list[str], timeout: float) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed with {result.returncode}:\n{result.stderr[-3000:]}")


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0


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
            return _status(f"http://{self.address}/") == 200 and all(
                _status(f"http://{self.address}/v1/models/{m}") == 200 for m in MODELS)

        try:
            wait_for(ready, timeout, "KServe to load its models", interval=0.25)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="session")
def kserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KServePeer]:
    """One KServe V1 server for the whole test session."""
    peer = KServePeer(tmp_path_factory.mktemp("kserve")).start()
    try:
        yield peer
    finally:
        peer.stop()
