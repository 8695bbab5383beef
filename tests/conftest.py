from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers.mlserver import mlserver  # noqa: F401 - the session-wide MLServer fixture
from peers.recording_upstream import RecordingUpstream
from support import BUILTIN_REST_CONFIG, GatewayProcess, write_config


@pytest.fixture(scope="module")
def builtin_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """The gateway in its own process: REST listener -> builtin models."""
    directory = tmp_path_factory.mktemp("gw")
    with GatewayProcess(write_config(directory, BUILTIN_REST_CONFIG), directory / "gateway.log") as gw:
        yield gw


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    """One keep-alive HTTP session for a module's plain-HTTP clients."""
    with requests.Session() as session:
        yield session


@pytest.fixture(scope="module")
def recorder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordingUpstream]:
    """A V2 REST and gRPC upstream that records what it received (tests/peers/recording_upstream.py)."""
    with RecordingUpstream(tmp_path_factory.mktemp("recorder")) as peer:
        yield peer
