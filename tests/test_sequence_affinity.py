"""Sequence affinity: a sequence's requests stay on the endpoint that holds
its state, across real V2 upstreams, and end clearly when it goes away.

Two gateway processes serve the builtin sequence models (the state lives in
each process); a front gateway balances round robin over both, through a
``v2-rest`` and a ``v2-grpc`` upstream. Without affinity every other step
would land on the endpoint that never saw the sequence's START.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from sequence_steps import run_example_over, start_on_each, step, unhealthy_endpoints
from tritonclient.utils import InferenceServerException

from gateway.config.address import Address
from gateway.config.upstreams import SequenceAffinity, UpstreamConfig
from gateway.core.hashing import highest_random_weight
from gateway.dataplane.affinity import SequencePins, sequence_step
from gateway.dataplane.cluster.cluster import Cluster
from gateway.observability.counters import Counters
from peers.fake_upstream import FakeFleet
from support import Clock, GatewayProcess, wait_for, write_config

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


# --- the pin table and the hash --------------------------------------------------------------------------

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


def test_rendezvous_agrees_in_any_order_and_moves_only_what_it_must() -> None:
    names = [f"10.0.0.{i}:8000" for i in range(1, 6)]
    keys = [f"i:{n}" for n in range(2000)]
    winners = {key: names[highest_random_weight(key, names)] for key in keys}
    assert all(names[::-1][highest_random_weight(key, names[::-1])] == winners[key] for key in keys)
    counts = [sum(1 for w in winners.values() if w == name) for name in names]
    assert min(counts) > 2000 / 5 * 0.8, counts  # an even spread
    # one leaves: only its keys move, each to its second best
    gone, rest = names[2], names[:2] + names[3:]
    after = {key: rest[highest_random_weight(key, rest)] for key in keys}
    assert all(after[key] == winners[key] for key in keys if winners[key] != gone)
    # one joins: it takes about 1/6 of the keys, none move between the others
    joined = [*names, "10.0.0.9:8000"]
    grown = {key: joined[highest_random_weight(key, joined)] for key in keys}
    moved = [key for key in keys if grown[key] != winners[key]]
    assert all(grown[key] == joined[-1] for key in moved)
    assert 2000 / 6 * 0.8 < len(moved) < 2000 / 6 * 1.2, len(moved)


def test_a_cluster_sends_a_sequence_by_its_id_to_an_available_endpoint() -> None:
    config = UpstreamConfig("u", "fake", tuple(Address("127.0.0.1", 9000 + i) for i in range(4)))
    cluster = Cluster(config, None, Counters(), client_factory=FakeFleet(), clock=Clock(1000.0))
    keys = [f"i:{n}" for n in range(400)]
    home = {key: cluster.sequence_endpoint(key, set()) for key in keys}
    assert len(set(home.values())) == 4
    # another replica, its endpoints listed in another order, agrees
    replica = Cluster(dataclasses.replace(config, endpoints=config.endpoints[::-1]), None, Counters(),
                      client_factory=FakeFleet(), clock=Clock(1000.0))
    assert all(replica.sequence_endpoint(key, set()).address == home[key].address for key in keys)
    # an unavailable endpoint's sequences go to their second choice; the others stay
    down = cluster.endpoints[1]
    down.healthy = False
    moved = {key: cluster.sequence_endpoint(key, set()) for key in keys}
    assert all(moved[key] is home[key] for key in keys if home[key] is not down)
    assert all(moved[key] is not down for key in keys)
    # what a request tried is left out while others remain (a connect failure's retry)
    first = cluster.sequence_endpoint(keys[0], set())
    assert cluster.sequence_endpoint(keys[0], {first}) is not first
    assert cluster.sequence_endpoint(keys[0], set(cluster.endpoints)) is first


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
    served = run_example_over(example, front.url(listener), backends, *(["-d"] if dyna else []))
    assert all(count > 0 for count in served), served  # both endpoints held sequences


def _step(client: httpclient.InferenceServerClient, sequence_id: int, value: int, *, start: bool = False,
          end: bool = False, upstream: str = "rest") -> int:
    return step(client, sequence_id, value, start=start, end=end, headers={"x-upstream": upstream})


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
        held = start_on_each(client, backends, 2, 101)
        ids = held[0] + held[1]
        backends[1].stop()
        wait_for(lambda: unhealthy_endpoints(front, "via-rest") == 1, 10,
                 "the front to mark the stopped endpoint unhealthy")
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
