"""What the peers that run in a virtualenv of their own share (MLServer,
KServe): the venv, made once under a file lock; the HTTP status of a
readiness probe; and stopping the process group a peer leads.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from support import REPO, wait_for

PEERS_DIR = REPO / ".test-peers"
INSTALL_TIMEOUT = 900.0


def ensure_venv(package: str, version: str, extras: str = "") -> Path:
    """``.test-peers/<package>-venv`` with ``package[extras]==version``
    installed: made on first use, reused while its marker file names the same
    version."""
    venv = PEERS_DIR / f"{package}-venv"
    marker = venv / f".installed-{package}-{version}"
    if marker.exists():
        return venv
    PEERS_DIR.mkdir(exist_ok=True)
    with open(PEERS_DIR / f"{package}-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test run may be installing it right now
        if not marker.exists():
            shutil.rmtree(venv, ignore_errors=True)  # a half-made venv from an interrupted run
            _run([sys.executable, "-m", "venv", str(venv)], 120)
            _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                  f"{package}{f'[{extras}]' if extras else ''}=={version}"], INSTALL_TIMEOUT)
            marker.write_text(version)
    return venv


def _run(command: list[str], timeout: float) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed with {result.returncode}:\n{result.stderr[-3000:]}")


def http_status(url: str) -> int:
    """The status a GET of ``url`` answers, or 0 if nothing answers yet."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0


def wait_until_serving(proc: subprocess.Popen[bytes], probe_url: str, timeout: float, what: str,
                       log: Callable[[], str]) -> None:
    """Waits until ``probe_url`` answers 200; a peer that exits first, or
    misses the time, is stopped and its log's end raised."""
    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log()[-5000:]}")
        return http_status(probe_url) == 200

    try:
        wait_for(ready, timeout, f"{what} to serve", interval=0.25)
    except BaseException:
        stop_group(proc)
        raise


def stop_group(proc: subprocess.Popen[bytes] | None) -> None:
    """Ends a peer started with ``start_new_session=True``: the process,
    then any helpers of its group it left behind."""
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
