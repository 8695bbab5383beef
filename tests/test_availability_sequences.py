"""The builtin sequence models' state over real sockets: bounded in bytes
(``sequences.max_state_bytes``), charged to the memory budget while a
sequence lives (``gateway_inflight_bytes``), refused past the bound in each
protocol's form, and given back when the sequence ends or expires. A
sequence keeps what its model needs only: ``simple_sequence`` nothing, so a
big START costs the process no memory once answered.

One gateway process; a prober on another listener measures the health
probe while the sequences come and go.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from peers.stall_attack import HealthProber, rss_bytes
from support import GatewayProcess, metric_value, scrape_metrics, wait_for, write_config

ROWS = 32_768  # a running sum of 256 KiB per simple_string_dyna_sequence
STATE = ROWS * 8
FITTING = 7  # sequences of STATE bytes (and their entries) within 2 MiB
CONFIG = """
admin: {address: "127.0.0.1:0"}
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
  - {name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}
  - {name: probe, protocol: v2-rest, address: "127.0.0.1:0"}
upstreams:
  - {name: local, protocol: builtin, sequences: {idle_timeout: 60s, max_state_bytes: 2MiB}}
  - {name: brief, protocol: builtin, sequences: {idle_timeout: 1s, max_state_bytes: 2MiB}}
routes:
  - match: {model: expiring}
    rewrite: {model: simple_string_dyna_sequence}
    upstream: brief
  - match: {model: "*"}
    upstream: local
"""
RUNNING_SUM = "simple_string_dyna_sequence"
WORST_PROBE = 1.0  # seconds: the bound of the stall test (tests/test_availability_stall.py)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("sequence-state")
    with GatewayProcess(write_config(directory, CONFIG), directory / "gateway.log") as gw:
        yield gw
    assert "Traceback" not in gw.log(), gw.log()[-3000:]


@contextmanager
def probed(port: int) -> Iterator[None]:
    """Health probes on ``port`` while the block runs: every one answered, promptly."""
    with HealthProber(port, interval=0.01) as probe:
        yield
    assert probe.latencies and probe.failures == 0, (probe.failures, len(probe.latencies))
    assert max(probe.latencies) <= WORST_PROBE, max(probe.latencies)


def inflight(gw: GatewayProcess) -> float:
    return metric_value(scrape_metrics(gw), "gateway_inflight_bytes")


def settles(gw: GatewayProcess, check: Callable[[float], bool], what: str) -> float:
    """The gauge (sampled by the gateway's loop-lag monitor) once ``check`` holds."""
    seen: list[float] = []

    def holds() -> bool:
        seen.append(inflight(gw))
        return check(seen[-1])

    wait_for(holds, 10, what)
    return seen[-1]


def step(gw: GatewayProcess, model: str, sequence: int, value: int, rows: int = ROWS, **flags: bool) -> np.ndarray:
    data = np.full((rows, 1), value, np.int32)
    with httpclient.InferenceServerClient(gw.url("rest"), network_timeout=30) as client:
        item = httpclient.InferInput("INPUT", list(data.shape), "INT32")
        item.set_data_from_numpy(data, binary_data=True)
        out = client.infer(model, [item], sequence_id=str(sequence), sequence_start=flags.get("start", False),
                           sequence_end=flags.get("end", False),
                           outputs=[httpclient.InferRequestedOutput("OUTPUT", binary_data=True)]).as_numpy("OUTPUT")
    assert out is not None and out.shape == (rows, 1)
    return out


def grpc_start(gw: GatewayProcess, model: str, sequence: int) -> None:
    data = np.ones((ROWS, 1), np.int32)
    with grpcclient.InferenceServerClient(gw.url("grpc")) as client:
        item = grpcclient.InferInput("INPUT", list(data.shape), "INT32")
        item.set_data_from_numpy(data)
        client.infer(model, [item], sequence_id=str(sequence), sequence_start=True, client_timeout=30)


def test_state_is_bounded_charged_and_given_back_when_sequences_end(gateway: GatewayProcess) -> None:
    with probed(gateway.ports["probe"]):
        for i in range(FITTING):
            assert (step(gateway, RUNNING_SUM, 100 + i, 3, start=True) == 3).all()
        held = settles(gateway, lambda v: v >= FITTING * STATE, "the live sequences' state in the gauge")
        assert held < FITTING * (STATE + 1024)  # the state and a small entry each, nothing else

        with pytest.raises(InferenceServerException) as refused:  # past max_state_bytes: the protocol's overload
            step(gateway, RUNNING_SUM, 200, 1, start=True)
        assert refused.value.status() == "429" and "max_state_bytes" in (refused.value.message() or "")
        with pytest.raises(InferenceServerException) as grpc_refused:
            grpc_start(gateway, RUNNING_SUM, 201)
        assert grpc_refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED", grpc_refused.value
        assert "max_state_bytes" in (grpc_refused.value.message() or "")

        assert (step(gateway, RUNNING_SUM, 100, 4) == 7).all()  # a live sequence steps on: its size is held already
        for i in range(FITTING):
            step(gateway, RUNNING_SUM, 100 + i, 0, end=True)
        settles(gateway, lambda v: v == 0, "every ended sequence's state given back")
        assert (step(gateway, RUNNING_SUM, 200, 5, start=True) == 5).all()  # room again
        step(gateway, RUNNING_SUM, 200, 0, end=True)
        settles(gateway, lambda v: v == 0, "the last sequence's state given back")


def test_an_idle_sequence_gives_its_state_back_without_another_request(gateway: GatewayProcess) -> None:
    with probed(gateway.ports["probe"]):
        for i in range(3):
            step(gateway, "expiring", 300 + i, 1, start=True)
        settles(gateway, lambda v: v >= 3 * STATE, "the sequences' state in the gauge")
        settles(gateway, lambda v: v == 0, "the idle sequences' state given back (idle_timeout 1s)")
    with pytest.raises(InferenceServerException) as forgotten:
        step(gateway, "expiring", 300, 1)
    assert forgotten.value.status() == "400" and "START" in (forgotten.value.message() or "")


def test_a_sequence_keeps_what_its_model_needs_only(gateway: GatewayProcess) -> None:
    """simple_sequence answers from the current request alone: a 1M-row
    START leaves nothing behind but the sequence's small entry."""
    assert gateway.proc is not None
    rows, sequences = 1 << 20, 16
    step(gateway, "simple_sequence", 400, 1, rows=rows, start=True, end=True)  # buffers warmed once
    before = rss_bytes(gateway.proc.pid)
    with probed(gateway.ports["probe"]):
        for i in range(sequences):
            assert (step(gateway, "simple_sequence", 500 + i, 2, rows=rows, start=True) == 3).all()
        # once the last answer is gone (the gauge is sampled): entries, no inputs
        settles(gateway, lambda v: 0 < v <= sequences * 1024, "the live sequences' entries alone in the gauge")
    grown = rss_bytes(gateway.proc.pid) - before
    assert grown < 48 << 20, f"RSS grew {grown >> 20} MiB for {sequences} sequences"  # whole inputs: 128 MiB
    for i in range(sequences):
        step(gateway, "simple_sequence", 500 + i, 0, rows=1, end=True)
    settles(gateway, lambda v: v == 0, "the entries given back")
