"""The gateway in its own process under a given open-file limit.

``GW_TEST_NOFILE=soft:hard python -m peers.nofile_gateway serve ...`` (with
``tests`` on PYTHONPATH) sets RLIMIT_NOFILE, then runs the gateway's CLI.
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

NOFILE_ENV = "GW_TEST_NOFILE"
TESTS = Path(__file__).resolve().parent.parent


def nofile_env(soft: int, hard: int) -> dict[str, str]:
    """The environment that starts this launcher with that limit."""
    return {NOFILE_ENV: f"{soft}:{hard}", "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def main() -> int:
    soft, hard = (int(n) for n in os.environ[NOFILE_ENV].split(":"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    from gateway.app.cli import main as gateway_main

    return gateway_main()


if __name__ == "__main__":
    sys.exit(main())
