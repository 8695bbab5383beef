"""The system shared-memory registry under attack: many registrations
neither exhaust the gateway's file descriptors nor answer 500, and many
concurrent calls do not stall the other listeners, however many regions
are registered. Health probes on another listener are measured during each
attack (tests/peers/shm_attack.py), as in the other availability tests.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.config.server import DEFAULT_MAX_SHARED_MEMORY_REGIONS
from peers.nofile_gateway import nofile_env
from peers.shm_attack import held, probe_during, register_many, unregister_unknown
from peers.stall_attack import Probe
from support import GatewayProcess, write_config

# The probe's bounds, as tests/test_availability_stall.py.
MEDIAN_BOUND = 0.050
MAX_BOUND = 1.0
TENANTS = 16  # tokens of the attacked listener: each may register the default count

CONFIG = """
admin: {{address: "127.0.0.1:0"}}
server:
  extensions: [system_shared_memory]
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"{auth}}}
  - {{name: probe, protocol: v2-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin}}
routes:
  - match: {{model: "*"}}
    upstream: local
"""


@pytest.fixture
def shm_object() -> Iterator[tuple[str, int]]:
    """A 4 KiB shared-memory object: (key, size)."""
    key, size = f"/gw-test-{uuid.uuid4().hex[:12]}", 4096
    fd = os.open(f"/dev/shm{key}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)
    os.close(fd)
    yield key, size
    os.unlink(f"/dev/shm{key}")


def _assert_probe(probe: Probe, report: str) -> None:
    median, worst = probe.figures()
    assert probe.failures == 0, report
    assert median <= MEDIAN_BOUND, report
    assert worst <= MAX_BOUND, report


def test_registrations_are_bounded_and_keep_no_descriptor(tmp_path: Path, shm_object: tuple[str, int]) -> None:
    """Over the limit of registrations, in a process with few descriptors:
    the ones past the limit are refused (429, never 500), no descriptor is
    kept per region, and the other listener's probes never fail."""
    key, size = shm_object
    attempts = DEFAULT_MAX_SHARED_MEMORY_REGIONS + 150
    gw = GatewayProcess(write_config(tmp_path, CONFIG.format(auth="")), tmp_path / "gateway.log",
                        nofile_env(256, 256), module="peers.nofile_gateway")
    with gw:
        assert gw.proc is not None
        names = [f"region-{i}" for i in range(attempts)]
        result, probe = probe_during(gw.ports["probe"], register_many, gw.ports["rest"], key, size, names)
        report = f"registers: {result}; probe: {len(probe.latencies)} answered, {probe.failures} failed, " \
                 f"median/max {probe.figures()}"
        assert result["statuses"] == {200: DEFAULT_MAX_SHARED_MEMORY_REGIONS,
                                      429: attempts - DEFAULT_MAX_SHARED_MEMORY_REGIONS}, report
        assert "server.max_shared_memory_regions" in result["refusal"], report
        _assert_probe(probe, report)
        assert held(gw.proc.pid, key) == []
        assert gw.proc.poll() is None


def test_unregisters_do_not_stall_other_listeners(tmp_path: Path, shm_object: tuple[str, int]) -> None:
    """Many tenants' regions registered, then 40 clients at once unregister
    names nobody registered: the other listener's probes stay fast."""
    key, size = shm_object
    tokens = [f"tenant-{i}-{uuid.uuid4().hex}" for i in range(TENANTS)]
    (tmp_path / "tokens").write_text("\n".join(tokens) + "\n")
    auth = ", auth: {token: {file: tokens}}"
    with GatewayProcess(write_config(tmp_path, CONFIG.format(auth=auth)), tmp_path / "gateway.log") as gw:
        for index, token in enumerate(tokens):
            names = [f"t{index}-{i}" for i in range(DEFAULT_MAX_SHARED_MEMORY_REGIONS)]
            registered = register_many(gw.ports["rest"], key, size, names, token)
            assert registered["statuses"] == {200: len(names)}, registered
        result, probe = probe_during(gw.ports["probe"], unregister_unknown, gw.ports["rest"], 40, 10, tokens[0])
        report = f"unregisters: {result}; probe: {len(probe.latencies)} answered, {probe.failures} failed, " \
                 f"median/max {probe.figures()}"
        assert result["statuses"] == {200: 40 * 10}, report
        assert len(probe.latencies) >= 3, f"the attack ended before it was measured: {report}"
        _assert_probe(probe, report)
