"""Sequence (stateful) models: the builtin sequence models step by step, and
Triton's own sequence example clients, unmodified, against the gateway."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gateway.builtin.sequences import DynaSequence, SequenceModel, SequenceSettings, StringDynaSequence
from gateway.errors import ErrorKind, GatewayError
from gateway.types import InferRequest, Tensor
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


def _request(model: str, value: int, **parameters: object) -> InferRequest:
    data = np.full((1, 1), value, dtype=np.int32)
    return InferRequest(model, inputs=[Tensor.from_numpy("INPUT", data, "INT32")], parameters=dict(parameters))


def _run(model: SequenceModel, value: int, **parameters: object) -> int:
    return int(model.infer(_request(model.name, value, **parameters))[0].data[0, 0])


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
