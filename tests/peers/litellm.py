"""LiteLLM's proxy as a test peer: an OpenAI-compatible server in a
virtualenv of its own (``.test-peers/litellm-venv``, made on first use
under a file lock; ~700 MB, the install took 90 s here), run as a separate
process on a free 127.0.0.1 port with a master key, serving the
deterministic provider of ``litellm_models/provider.py`` for every model
of :data:`MODELS`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from peers import venv_peer
from support import free_port

LITELLM_VERSION = "1.100.0"
PROVIDER_DIR = Path(__file__).resolve().parent / "litellm_models"
MASTER_KEY = "sk-gw-test-4f1c9e0b7a2d"
# model -> the OpenAI API the tests call it through
MODELS = {"chat-echo": "chat", "text-echo": "completions", "embed-echo": "embeddings"}


def ensure_venv() -> Path:
    """The virtualenv's ``litellm`` command, installing litellm[proxy] on first use."""
    return venv_peer.ensure_venv("litellm", LITELLM_VERSION, "proxy") / "bin" / "litellm"


def _config() -> str:
    models = "".join(f"  - {{model_name: {name}, litellm_params: {{model: gwtest/{name}}}}}\n" for name in MODELS)
    return ("model_list:\n" + models +
            "litellm_settings:\n"
            "  drop_params: true\n"  # the SDK's encoding_format, which the provider need not take
            "  custom_provider_map:\n"
            "    - {provider: gwtest, custom_handler: provider.handler}\n"
            f"general_settings:\n  master_key: {MASTER_KEY}\n")


class LiteLlmPeer:
    """One LiteLLM proxy process."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.address}/v1"

    def log(self) -> str:
        path = self.workdir / "litellm.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout: float = 120.0) -> LiteLlmPeer:
        command = ensure_venv()
        # The provider module is imported from beside the config file.
        (self.workdir / "provider.py").write_text((PROVIDER_DIR / "provider.py").read_text())
        (self.workdir / "config.yaml").write_text(_config())
        self.port = free_port()
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
               "LITELLM_LOG": "ERROR"}
        with open(self.workdir / "litellm.log", "wb") as log:
            # Through the venv's python: the script's shebang names the path the venv was made at.
            self.proc = subprocess.Popen([str(command.parent / "python"), str(command), "--config", "config.yaml",
                                          "--host", "127.0.0.1", "--port", str(self.port), "--num_workers", "1"],
                                         cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        venv_peer.wait_until_serving(self.proc, f"http://{self.address}/health/liveliness", timeout,
                                     "LiteLLM's proxy", self.log)
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        venv_peer.stop_group(proc)


@pytest.fixture(scope="session")
def litellm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiteLlmPeer]:
    """One LiteLLM proxy for the whole test session."""
    peer = LiteLlmPeer(tmp_path_factory.mktemp("litellm")).start()
    try:
        yield peer
    finally:
        peer.stop()
