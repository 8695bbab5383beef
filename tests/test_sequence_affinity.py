"""Sequence affinity: a sequence's requests stay on the endpoint that holds
its state, across real V2 upstreams, and end clearly when it goes away.

Two gateway processes serve the builtin sequence models (the state lives in
each process); a front gateway balances round robin over both, through a
``v2-rest`` and a ``v2-grpc`` upstream. Without affinity every other step
would land on the endpoint that never saw the sequence's START.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gateway.config.upstreams import SequenceAffinity
from gateway.dataplane.affinity import SequencePins, sequence_step
from support import Clock, GatewayProcess, scrape_metrics, wait_for, write_config

EXAMPLES = Path(__file__).resolve().parent / "data" / "triton_examples"

BACKEND = """
admin: {address: "127.0.0.1:0"}
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
  - {name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}
upstreams: [{name: local, protocol: builtin}]
routes: [{match: {model: "*"}, upstream: local}]
"""


def front_config(backends: list[GatewayProcess]) -> str:
    rest = ", ".join(f'"127.0.0.1:{b.ports["rest"]}"' for b in backends)
    grpc_ = ", ".join(f'"127.0.0.1:{b.ports["grpc"]}"' for b in backends)
    health = "health_check: {interval: 100ms, timeout: 1s, unhealthy_threshold: 1, healthy_threshold: 1}"
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: via-rest, protocol: v2-rest, endpoints: [{rest}], load_balancing: {{policy: round_robin}}, {health}}}
  - {{name: via-grpc, protocol: v2-grpc, endpoints: [{grpc_}], load_balancing: {{policy: round_robin}}}}
routes:
  - {{match: {{headers: {{x-upstream: grpc}}}}, upstream: via-grpc}}
  - {{match: {{model: "*"}}, upstream: via-rest}}
"""


# --- the pin table ---------------------------------------------------------------------------------------

def test_sequence_step_reads_triton_parameters() -> None:
    assert sequence_step({}) is None
    assert sequence_step({"sequence_id": 0}) is None
    assert sequence_step({"sequence_id": ""}) is None
    assert sequence_step({"sequence_id": True}) is None
    step = sequence_step({"sequence_id": 7, "sequence_start": True})
    assert step is not None and step.start and not step.end
    assert step.key != sequence_step({"sequence_id": "7"}).key  # type: ignore[union-attr]


def test_pins_refresh_expire_and_stay_bounded() -> None:
    clock = Clock()
    pins = SequencePins(SequenceAffinity(idle_timeout=10, max_sequences=2), clock)
    pins.pin("a", "e1")
    clock.now = 6
    pins.pin("b", "e2")
    clock.now = 9
    assert pins.endpoint_of("a") == "e1"  # refreshed at 9
    clock.now = 17  # b idle 11 s: gone; a idle 8 s: kept
    assert pins.endpoint_of("b") is None and pins.endpoint_of("a") == "e1"
    pins.pin("c", "e2")
    pins.pin("d", "e1")  # three pins, bound two: the least recently used (a) goes
    assert pins.endpoint_of("a") is None and len(pins) == 2
    pins.unpin("c")
    assert pins.endpoint_of("c") is None and pins.endpoint_of("d") == "e1" and len(pins) == 1


# --- through real upstreams ----------------------------------------------------------------------------------

@pytest.fixture
def chain(tmp_path: Path) -> Iterator[tuple[GatewayProcess, list[GatewayProcess]]]:
    started: list[GatewayProcess] = []
    try:
        for name in ("a", "b"):
            directory = tmp_path / name
            directory.mkdir()
            started.append(GatewayProcess(write_config(directory, BACKEND), directory / "gateway.log").start())
        front = GatewayProcess(write_config(tmp_path, front_config(started)), tmp_path / "front.log").start()
        started.append(front)
        yield front, started[:2]
    finally:
        for process in started:
            process.stop()


@pytest.mark.parametrize("example, listener", [
    ("simple_http_sequence_sync_infer_client.py", "rest"),
    ("simple_grpc_sequence_sync_infer_client.py", "grpc"),
    ("simple_grpc_sequence_stream_infer_client.py", "grpc"),  # a stream in front, unary calls behind
    ("simple_grpc_aio_sequence_stream_infer_client.py", "grpc"),
])
@pytest.mark.parametrize("dyna", [False, True])
def test_triton_sequence_examples_pass_over_two_endpoints(chain: tuple[GatewayProcess, list[GatewayProcess]],
                                                          example: str, listener: str, dyna: bool) -> None:
    front, backends = chain
    # A sequence's endpoint follows its id's hash: new ids (--offset) until
    # both endpoints have held sequences (each run has 1/4 odds of one alone).
    for offset in range(10):
        args = [sys.executable, str(EXAMPLES / example), "-u", front.url(listener), "-o", str(offset),
                *(["-d"] if dyna else [])]
        result = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and "PASS" in result.stdout, result.stdout + result.stderr
        served = [_sequence_requests(b) for b in backends]
        if all(count > 0 for count in served):
            break
    assert all(count > 0 for count in served), served  # both endpoints held sequences


def _sequence_requests(gateway: GatewayProcess) -> float:
    return sum(value for name, labels, value in scrape_metrics(gateway)
               if name == "gateway_requests_total" and "sequence" in labels.get("model", ""))


def _step(client: httpclient.InferenceServerClient, sequence_id: int, value: int, *, start: bool = False,
          end: bool = False, upstream: str = "rest") -> int:
    data = np.full((1, 1), value, dtype=np.int32)
    item = httpclient.InferInput("INPUT", [1, 1], "INT32")
    item.set_data_from_numpy(data)
    result = client.infer("simple_string_dyna_sequence", [item], sequence_id=str(sequence_id),
                          sequence_start=start, sequence_end=end, headers={"x-upstream": upstream})
    return int(result.as_numpy("OUTPUT")[0, 0])


@pytest.mark.parametrize("upstream", ["rest", "grpc"])
def test_running_sums_stay_whole_under_round_robin(chain: tuple[GatewayProcess, list[GatewayProcess]],
                                                   upstream: str) -> None:
    front, _ = chain
    with httpclient.InferenceServerClient(front.url("rest")) as client:
        ids = range(1, 7)
        for sequence_id in ids:  # six sequences, interleaved step by step
            assert _step(client, sequence_id, sequence_id, start=True, upstream=upstream) == sequence_id
        for step in range(1, 4):
            for sequence_id in ids:
                assert _step(client, sequence_id, 10, upstream=upstream) == sequence_id + 10 * step
        for sequence_id in ids:
            assert _step(client, sequence_id, 0, end=True, upstream=upstream) == sequence_id + 30 + sequence_id


def test_an_endpoint_that_goes_away_ends_its_sequences(chain: tuple[GatewayProcess, list[GatewayProcess]]) -> None:
    front, backends = chain
    with httpclient.InferenceServerClient(front.url("rest")) as client:
        held: list[list[int]] = [[], []]  # the sequences each endpoint holds, two each
        for sequence_id in range(101, 165):
            before = _sequence_requests(backends[1])
            _step(client, sequence_id, 1, start=True)
            side = held[1] if _sequence_requests(backends[1]) > before else held[0]
            if len(side) < 2:
                side.append(sequence_id)
            else:
                _step(client, sequence_id, 0, end=True)
            if len(held[0]) == len(held[1]) == 2:
                break
        ids = held[0] + held[1]
        backends[1].stop()
        wait_for(lambda: _unhealthy_endpoints(front) == 1, 10, "the front to mark the stopped endpoint unhealthy")
        survived, ended = [], []
        for sequence_id in ids:
            try:
                assert _step(client, sequence_id, 1) == 2  # its state is whole: never moved
                survived.append(sequence_id)
            except InferenceServerException as error:
                assert error.status() == "503", error
                assert "sequence has ended" in error.message() and "127.0.0.1" not in error.message()
                ended.append(sequence_id)
        assert survived == held[0] and ended == held[1], (held, survived, ended)
        for sequence_id in ended:  # ended means ended: without START it is refused, not silently moved
            with pytest.raises(InferenceServerException, match="START flag"):
                _step(client, sequence_id, 1)
            assert _step(client, sequence_id, 5, start=True) == 5  # a new START goes to a live endpoint


def _unhealthy_endpoints(front: GatewayProcess) -> int:
    return sum(1 for name, labels, value in scrape_metrics(front)
               if name == "gateway_endpoint_healthy" and labels.get("upstream") == "via-rest" and value == 0)
