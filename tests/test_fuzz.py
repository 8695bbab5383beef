"""The coverage-guided fuzz targets (tests/fuzz_targets.py), each run for
a bounded number of iterations: only the protocol's own errors may escape
a frontend decoder. libFuzzer runs in its own process (it owns the process
and exits when done), so a crash is a non-zero exit with the input saved."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO

RUNS = 100000
SECONDS = 4  # per target, whichever bound comes first


@pytest.mark.parametrize("target", ["v2_rest_json", "v2_rest_binary", "v2_grpc", "umbridge", "graphstorm", "v1_rest",
                                    "openai"])
def test_fuzz_target(target: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "fuzz_targets.py"), target, f"-runs={RUNS}",
         f"-max_total_time={SECONDS}", "-max_len=4096", f"-artifact_prefix={tmp_path}/", str(tmp_path / "corpus")],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    log = done.stderr[-4000:]
    assert done.returncode == 0, f"fuzzing {target} found a crash:\n{log}"
    assert "INITED" in done.stderr and "Done " in log
    assert not list(tmp_path.glob("crash-*"))
