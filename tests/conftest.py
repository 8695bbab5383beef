from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from support import BUILTIN_REST_CONFIG, GatewayProcess, write_config  # noqa: E402


@pytest.fixture(scope="module")
def builtin_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """The gateway in its own process: REST listener -> builtin models."""
    directory = tmp_path_factory.mktemp("gw")
    with GatewayProcess(write_config(directory, BUILTIN_REST_CONFIG), directory / "gateway.log") as gw:
        yield gw
