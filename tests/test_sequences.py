"""Sequence (stateful) models: the builtin sequence models step by step, and
Triton's own sequence example clients, unmodified, against the gateway."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import InferenceServerException

from gateway.app.configure import parse_config
from gateway.config.node import ConfigError
from gateway.core.errors import ErrorKind, GatewayError, Saturated
from gateway.core.types import InferRequest, RequestContext, Tensor
from gateway.dataplane.plane import DataPlane
from gateway.protocols import registry
from gateway.protocols.builtin.sequences import DynaSequence, SequenceModel, SequenceSettings, StringDynaSequence
from gateway.runtime.budget import InflightBudget
from gateway.runtime.services import GatewayServices
from support import Clock, GatewayProcess, write_config

EXAMPLES = Path(__file__).resolve().parent / "data" / "triton_examples"

CONFIG = """
admin: {address: "127.0.0.1:0"}
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
  - {name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}
upstreams:
  - {name: local, protocol: builtin, sequences: {idle_timeout: 30s, max_sequences: 8}}
routes:
  - match: {model: "*"}
    upstream: local
"""


def _request(model: str, value: int, rows: int = 1, **parameters: object) -> InferRequest:
    data = np.full((rows, 1), value, dtype=np.int32)
    return InferRequest(model, inputs=[Tensor.from_numpy("INPUT", data, "INT32")], parameters=dict(parameters))


# --- the models, as Triton's examples define them ------------------------------------------------------

def test_simple_sequence_adds_one_on_start_only() -> None:
    model = SequenceModel("simple_sequence")
    assert _run(model, 0, sequence_id=7, sequence_start=True) == 1
    assert _run(model, 11, sequence_id=7) == 11
    assert _run(model, -5, sequence_id="a-uuid", sequence_start=True) == -4  # string ids work too
    assert _run(model, 3, sequence_id=7, sequence_end=True) == 3
    assert model.live_sequences() == 1  # 7 ended, "a-uuid" is live


def test_dyna_sequence_adds_the_correlation_id_on_end() -> None:
    model = DynaSequence("simple_dyna_sequence")
    assert _run(model, 100, sequence_id=1001, sequence_start=True) == 101
    assert _run(model, -11, sequence_id=1001) == -11
    assert _run(model, -1, sequence_id=1001, sequence_end=True) == -1 + 1001
    with pytest.raises(GatewayError, match="integer correlation ID"):
        _run(model, 1, sequence_id="abc", sequence_start=True)


def test_string_dyna_sequence_keeps_a_running_sum() -> None:
    model = StringDynaSequence("simple_string_dyna_sequence")
    assert _run(model, 20, sequence_id="1002", sequence_start=True) == 20
    assert _run(model, -11, sequence_id="1002") == 9
    assert _run(model, -7, sequence_id="1002") == 2
    assert _run(model, -1, sequence_id="1002", sequence_end=True) == 1 + 1002
    with pytest.raises(GatewayError, match="reads as an integer"):
        _run(model, 1, sequence_id="not-a-number", sequence_start=True)


def test_sequences_are_separate() -> None:
    model = StringDynaSequence("simple_string_dyna_sequence")
    _run(model, 10, sequence_id="1", sequence_start=True)
    _run(model, 100, sequence_id="2", sequence_start=True)
    assert _run(model, 1, sequence_id="1") == 11
    assert _run(model, 1, sequence_id="2") == 101


@pytest.mark.parametrize("parameters, message", [
    ({}, "non-zero or non-empty correlation ID"),
    ({"sequence_id": 0, "sequence_start": True}, "non-zero or non-empty correlation ID"),
    ({"sequence_id": "", "sequence_start": True}, "non-zero or non-empty correlation ID"),
    ({"sequence_id": 5}, "must specify the START flag"),
    ({"sequence_id": 1.5, "sequence_start": True}, "integer or a string"),
    ({"sequence_id": 5, "sequence_start": "yes"}, "must be a boolean"),
])
def test_bad_sequence_controls_are_invalid_input(parameters: dict[str, object], message: str) -> None:
    with pytest.raises(GatewayError, match=message) as caught:
        _run(SequenceModel("simple_sequence"), 1, **parameters)
    assert caught.value.kind is ErrorKind.INVALID_INPUT


def test_an_ended_sequence_needs_a_new_start() -> None:
    model = SequenceModel("simple_sequence")
    _run(model, 1, sequence_id=9, sequence_start=True, sequence_end=True)
    with pytest.raises(GatewayError, match="START flag"):
        _run(model, 1, sequence_id=9)


def test_idle_sequences_expire_and_the_count_is_bounded() -> None:
    clock = Clock()
    model = StringDynaSequence("simple_string_dyna_sequence", SequenceSettings(idle_seconds=10, max_sequences=2),
                               clock)
    _run(model, 1, sequence_id="1", sequence_start=True)
    clock.now = 5
    _run(model, 1, sequence_id="2", sequence_start=True)
    with pytest.raises(GatewayError, match="live sequences") as caught:
        _run(model, 1, sequence_id="3", sequence_start=True)
    assert caught.value.kind is ErrorKind.OVERLOADED
    clock.now = 11  # "1" idle for 11 s: forgotten; "2" for 6 s: kept
    assert _run(model, 1, sequence_id="2") == 2
    _run(model, 1, sequence_id="3", sequence_start=True)
    with pytest.raises(GatewayError, match="START flag"):
        _run(model, 1, sequence_id="1")


def test_an_end_id_that_does_not_fit_the_output_is_refused() -> None:
    with pytest.raises(GatewayError, match="does not fit"):
        _run(DynaSequence("simple_dyna_sequence"), 1, sequence_id=2**40, sequence_start=True)


# --- the state: what the model needs, bounded and charged to the memory budget ---------------------------

def test_a_sequence_keeps_only_what_its_model_needs_and_is_charged_for_it() -> None:
    budget = InflightBudget(1 << 30)
    simple = SequenceModel("simple_sequence", budget=budget)
    simple.infer(_request("simple_sequence", 5, rows=100_000, sequence_id=1, sequence_start=True))
    assert 0 < simple.held_bytes <= 1024  # no copy of the input: the answer needs none
    running = StringDynaSequence("simple_string_dyna_sequence", budget=budget)
    running.infer(_request("simple_string_dyna_sequence", 5, rows=100_000, sequence_id="1", sequence_start=True))
    assert 800_000 <= running.held_bytes <= 800_000 + 1024  # the running sum, one int64 per row
    assert budget.used == simple.held_bytes + running.held_bytes


def test_state_is_given_back_on_end_restart_expiry_and_close() -> None:
    clock, budget = Clock(), InflightBudget(1 << 30)
    model = StringDynaSequence("simple_string_dyna_sequence", SequenceSettings(idle_seconds=10), clock, budget)
    model.infer(_request(model.name, 1, rows=1000, sequence_id="1", sequence_start=True))
    model.infer(_request(model.name, 1, rows=10, sequence_id="2", sequence_start=True))
    large = budget.used
    model.infer(_request(model.name, 1, rows=10, sequence_id="1", sequence_start=True))  # restarted smaller
    assert budget.used == model.held_bytes < large - 7000
    model.infer(_request(model.name, 1, rows=10, sequence_id="2", sequence_end=True))
    assert budget.used == model.held_bytes > 0 and model.live_sequences() == 1
    clock.now = 11
    model.forget_idle()  # the backend's sweeper calls this: no request needed
    assert budget.used == model.held_bytes == 0
    model.infer(_request(model.name, 1, rows=10, sequence_id="3", sequence_start=True))
    model.forget_all()  # the upstream closes (reload, shutdown)
    assert budget.used == model.held_bytes == 0 and model.live_sequences() == 0


def test_past_max_state_bytes_or_the_budget_a_step_is_refused_and_changes_nothing() -> None:
    settings = SequenceSettings(max_state_bytes=64 << 10)
    model = StringDynaSequence("simple_string_dyna_sequence", settings, budget=InflightBudget(1 << 30))
    with pytest.raises(GatewayError, match="max_state_bytes") as alone:
        _run(model, 1, rows=10_000, sequence_id="1", sequence_start=True)  # 80 KB: never fits
    assert alone.value.kind is ErrorKind.TOO_LARGE
    _run(model, 1, rows=4500, sequence_id="1", sequence_start=True)  # 36 KB: two do not fit
    with pytest.raises(GatewayError, match="max_state_bytes") as together:
        _run(model, 1, rows=4500, sequence_id="2", sequence_start=True)
    assert together.value.kind is ErrorKind.OVERLOADED
    with pytest.raises(GatewayError, match="START flag"):
        _run(model, 1, sequence_id="2")  # the refused START opened nothing
    assert _run(model, 2, rows=4500, sequence_id="1") == 3  # the live one steps on, same size

    budget = InflightBudget(40_000)
    model = StringDynaSequence("simple_string_dyna_sequence", budget=budget)
    _run(model, 1, rows=4000, sequence_id="1", sequence_start=True)
    with pytest.raises(Saturated, match="max_inflight_bytes"):
        _run(model, 1, rows=1000, sequence_id="2", sequence_start=True)
    with pytest.raises(Saturated):
        _run(model, 5, rows=4500, sequence_id="1")  # a bigger state for "1": refused, its sum kept
    assert _run(model, 1, rows=4000, sequence_id="1") == 2
    assert budget.used == model.held_bytes


def _run(model: SequenceModel, value: int, rows: int = 1, **parameters: object) -> int:
    return int(model.infer(_request(model.name, value, rows, **parameters))[0].data[0, 0])


def test_max_state_bytes_is_read_and_checked() -> None:
    def upstream(sequences: str) -> dict[str, object]:
        return yaml.safe_load(f"""
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin, sequences: {sequences}}}
routes:
  - {{match: {{model: "*"}}, upstream: local}}
""")

    config = parse_config(upstream("{max_state_bytes: 8MiB}"))
    assert config.upstreams[0].options.sequences.max_state_bytes == 8 << 20
    with pytest.raises(ConfigError, match="max_state_bytes"):
        parse_config(upstream("{max_state_bytes: 1KiB}"))
    with pytest.raises(ConfigError, match="max_state_bytes"):
        parse_config(upstream("{max_state_bytes: lots}"))


async def test_closing_or_rebuilding_the_upstream_gives_its_state_back() -> None:
    text = """
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
upstreams:
  - {name: local, protocol: builtin, sequences: {idle_timeout: %s}}
routes:
  - {match: {model: "*"}, upstream: local}
"""
    config = parse_config(yaml.safe_load(text % "60s"))
    services = GatewayServices(config, config.server)
    plane = DataPlane(config, services, backends=registry.backend)
    await plane.start()
    try:
        async def start(sequence: str) -> None:
            request = _request("simple_string_dyna_sequence", 1, rows=1000, sequence_id=sequence,
                               sequence_start=True)
            await plane.infer(request, RequestContext("rest", "v2-rest"))

        await start("1")
        assert services.budget.used >= 8000
        changed = parse_config(yaml.safe_load(text % "30s"))  # a new upstream: a new cluster, the old one closes
        await plane.swap(changed, services)
        for _ in range(100):
            if services.budget.used == 0:
                break
            await asyncio.sleep(0.01)
        assert services.budget.used == 0
        await start("2")
        assert services.budget.used >= 8000
    finally:
        await plane.close()
    assert services.budget.used == 0


# --- through the gateway ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("sequences")
    with GatewayProcess(write_config(directory, CONFIG), directory / "gateway.log") as gw:
        yield gw


@pytest.mark.parametrize("example, listener, offset", [
    ("simple_http_sequence_sync_infer_client.py", "rest", 0),
    ("simple_grpc_sequence_sync_infer_client.py", "grpc", 10),
    ("simple_grpc_sequence_stream_infer_client.py", "grpc", 20),  # ModelStreamInfer
    ("simple_grpc_aio_sequence_stream_infer_client.py", "grpc", 30),
])
@pytest.mark.parametrize("dyna", [False, True])
def test_triton_sequence_examples_pass_unmodified(gateway: GatewayProcess, example: str, listener: str,
                                                  offset: int, dyna: bool) -> None:
    # distinct offsets: the examples' sequence ids must not collide between runs on one gateway
    args = [sys.executable, str(EXAMPLES / example), "-u", gateway.url(listener), "-o", str(offset + 2 * dyna)]
    result = subprocess.run([*args, *(["-d"] if dyna else [])], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "PASS" in result.stdout, result.stdout + result.stderr


def test_sequence_errors_reach_tritonclient_in_each_protocol(gateway: GatewayProcess) -> None:
    data = np.ones((1, 1), dtype=np.int32)
    rest_input = httpclient.InferInput("INPUT", [1, 1], "INT32")
    rest_input.set_data_from_numpy(data)
    with httpclient.InferenceServerClient(gateway.url("rest")) as rest:
        with pytest.raises(InferenceServerException, match="START flag") as caught:
            rest.infer("simple_sequence", [rest_input], sequence_id=424242)
        assert caught.value.status() == "400"
        with pytest.raises(InferenceServerException, match="correlation ID"):
            rest.infer("simple_sequence", [rest_input])
    grpc_input = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    grpc_input.set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(gateway.url("grpc")) as client:
        with pytest.raises(InferenceServerException, match="START flag") as caught:
            client.infer("simple_sequence", [grpc_input], sequence_id="never-started")
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
