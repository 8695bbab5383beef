"""House rules as tests: ruff on the code and tests, mypy on the package."""

from __future__ import annotations

import subprocess
import sys

from support import REPO


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff() -> None:
    result = _run("ruff", "check", "--output-format", "concise", "gateway", "tests", "bench", "protos")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy() -> None:
    result = _run("mypy", "gateway")
    assert result.returncode == 0, result.stdout + result.stderr
