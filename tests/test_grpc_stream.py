"""gRPC ModelStreamInfer in Triton's message form, over real sockets:
tritonclient.grpc streams (sync and aio) -> gateway -> builtin `simple`
(a unary model), the decoupled `repeat_int32`, and a real MLServer over
V2 gRPC; per-request errors, sequences in order, cancel, a slow reader,
the open-streams limit, and Triton's own example client unchanged."""

from __future__ import annotations

import asyncio
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from stream_client import Stream, final_flag, repeat_inputs
from tritonclient.utils import InferenceServerException

from gateway.core.types import InferRequest, Tensor
from gateway.protocols.v2_grpc import codec
from gateway.protocols.v2_grpc import messages as pb
from peers.mlserver import MLServerPeer
from support import REPO, GatewayProcess, metric_value, scrape_metrics, wait_for, write_config

STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
EXAMPLES = REPO / "tests" / "data" / "triton_examples"
CONFIG = """
admin: {address: "127.0.0.1:0"}
limits: {max_open_streams: 4, max_stream_requests: 4, stream_buffer_responses: 2, max_request_bytes: 4MiB}
listeners:
  - {name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}
upstreams:
  - {name: local, protocol: builtin}
routes:
  - match: {model: "*"}
    upstream: local
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("stream")
    with GatewayProcess(write_config(directory, CONFIG), directory / "gateway.log") as gw:
        yield gw


def simple_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        item = grpcclient.InferInput(name, list(array.shape), "INT32")
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


def test_unary_model_one_final_response_per_request(gateway: GatewayProcess) -> None:
    stream = Stream(gateway.url("grpc"))
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        for i in range(3):
            stream.client.async_stream_infer("simple", simple_inputs(a, a * i), request_id=f"r{i}")
        # Triton sends a non-decoupled model's one response, final, and no empty one even when asked.
        stream.client.async_stream_infer("simple", simple_inputs(a, a), request_id="r3",
                                         enable_empty_final_response=True)
        seen = {}
        for _ in range(4):
            result, error = stream.next()
            assert error is None
            seen[result.get_response().id] = result
            assert final_flag(result) is True
        assert sorted(seen) == ["r0", "r1", "r2", "r3"]
        for i in range(3):
            np.testing.assert_array_equal(seen[f"r{i}"].as_numpy("OUTPUT0"), a + a * i)
            np.testing.assert_array_equal(seen[f"r{i}"].as_numpy("OUTPUT1"), a - a * i)
        assert seen["r0"].get_response().model_name == "simple"
        with pytest.raises(queue.Empty):
            stream.next(timeout=0.3)
    finally:
        stream.close()


def test_decoupled_model_responses_then_empty_final(gateway: GatewayProcess) -> None:
    stream = Stream(gateway.url("grpc"))
    try:
        stream.client.async_stream_infer("repeat_int32", repeat_inputs([7, 8, 9]), request_id="rep",
                                         outputs=[grpcclient.InferRequestedOutput("OUT"),
                                                  grpcclient.InferRequestedOutput("IDX")],
                                         enable_empty_final_response=True)
        results = [stream.next() for _ in range(4)]
        assert all(error is None for _, error in results)
        data, last = [r for r, _ in results[:3]], results[3][0]
        assert [int(r.as_numpy("OUT")[0]) for r in data] == [7, 8, 9]
        assert [int(r.as_numpy("IDX")[0]) for r in data] == [0, 1, 2]
        assert [final_flag(r) for r in data] == [False, False, False]
        assert final_flag(last) is True and not last.get_response().outputs
        assert last.get_response().id == "rep" and last.get_response().model_name == "repeat_int32"
        # Without the parameter, no empty final response (as Triton); an empty IN sends nothing at all.
        stream.client.async_stream_infer("repeat_int32", repeat_inputs([]), request_id="none")
        stream.client.async_stream_infer("repeat_int32", repeat_inputs([5]), request_id="one")
        result, error = stream.next()
        assert error is None and result.get_response().id == "one" and final_flag(result) is False
        with pytest.raises(queue.Empty):
            stream.next(timeout=0.3)
    finally:
        stream.close()


def test_errors_go_back_per_request_and_the_stream_goes_on(gateway: GatewayProcess) -> None:
    stream = Stream(gateway.url("grpc"))
    try:
        a = np.ones((1, 16), dtype=np.int32)
        stream.client.async_stream_infer("no_such_model", simple_inputs(a, a), request_id="e1")
        assert "no_such_model" in str(stream.next()[1])
        wrong = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        wrong.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
        stream.client.async_stream_infer("simple", [wrong, simple_inputs(a, a)[1]], request_id="e2")
        error = stream.next()[1]
        assert isinstance(error, InferenceServerException) and "must be INT32" in error.message()
        stream.client.async_stream_infer("simple", simple_inputs(a, a), request_id="ok")
        result, error = stream.next()
        assert error is None and result.get_response().id == "ok"
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    finally:
        stream.close()


def raw_stream(url: str, messages: list[bytes], timeout: float = 10.0) -> list[Any]:
    """Sends serialized messages on one call; the ModelStreamInferResponses back."""
    with grpc.insecure_channel(url) as channel:
        call = channel.stream_stream(STREAM_METHOD, request_serializer=None,
                                     response_deserializer=pb.ModelStreamInferResponse.FromString)
        return list(call(iter(messages), timeout=timeout))


def infer_message(model: str, request_id: str, parameters: dict[str, Any] | None = None, **inputs: Any) -> bytes:
    tensors = [Tensor.from_numpy(name, np.asarray(value)) for name, value in inputs.items()]
    return codec.encode_infer_request(InferRequest(model, "", request_id, tensors, [], parameters or {}))


def test_bad_messages_are_answered_in_the_stream(gateway: GatewayProcess) -> None:
    good = infer_message("simple", "good", INPUT0=np.ones((1, 16), np.int32), INPUT1=np.ones((1, 16), np.int32))
    replies = raw_stream(gateway.url("grpc"), [b"\xff\xff\xff", infer_message("", "nameless"),
                                               infer_message("simple", "short", INPUT0=np.ones(3, np.int32)), good])
    assert len(replies) == 4
    errors = [r.error_message for r in replies if r.error_message]
    assert len(errors) == 3
    assert any("not a valid inference.ModelInferRequest" in e for e in errors)
    assert any("no model_name" in e for e in errors)
    ok = [r for r in replies if not r.error_message]
    assert [r.infer_response.id for r in ok] == ["good"]
    assert ok[0].infer_response.parameters["triton_final_response"].bool_param is True
    failed = next(r for r in replies if "must have shape" in r.error_message)
    assert failed.infer_response.id == "short"
    assert failed.infer_response.parameters["triton_final_response"].bool_param is True


def tensor_message(request_id: str, shape: list[int], raw: bytes, model: str = "identity") -> bytes:
    """A ModelInferRequest with one UINT8 input as given, checked by nobody."""
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="INPUT0", datatype="UINT8", shape=shape)
    request.raw_input_contents.append(raw)
    return request.SerializeToString()  # type: ignore[no-any-return]


def test_every_error_carries_its_request_id(gateway: GatewayProcess) -> None:
    """Requests that parse but fail the tensor checks while decoding are
    answered in the stream with their own id, model and the final flag,
    like those that fail later; the stream goes on."""
    bad = {
        "short-raw": (tensor_message("short-raw", [8], b"\0" * 3), "has 3 bytes of data"),
        "huge-shape": (tensor_message("huge-shape", [1 << 40], b""), "max_tensor_elements"),
        "negative-shape": (tensor_message("negative-shape", [-2], b""), "negative"),
        "nameless": (tensor_message("nameless", [1], b"\0", model=""), "no model_name"),
    }
    in_region = pb.ModelInferRequest(model_name="identity", id="in-region")
    in_region.inputs.add(name="INPUT0", datatype="UINT8", shape=[4]).parameters[
        "shared_memory_region"].string_param = "r"
    bad["in-region"] = (in_region.SerializeToString(), "system_shared_memory")  # the extension is off here
    good = tensor_message("good", [2], b"\1\2")
    replies = raw_stream(gateway.url("grpc"), [message for message, _ in bad.values()] + [good])
    assert len(replies) == len(bad) + 1
    by_id = {r.infer_response.id: r for r in replies}
    assert sorted(by_id) == sorted([*bad, "good"])
    for request_id, (_, words) in bad.items():
        reply = by_id[request_id].infer_response
        assert words in by_id[request_id].error_message, by_id[request_id].error_message
        assert reply.model_name == ("" if request_id == "nameless" else "identity")
        assert reply.parameters["triton_final_response"].bool_param is True
    assert by_id["good"].error_message == "" and by_id["good"].infer_response.raw_output_contents == [b"\1\2"]


def test_a_message_over_the_size_limit_ends_only_its_stream(gateway: GatewayProcess) -> None:
    """grpc refuses it itself, before the gateway reads it: the stream ends
    with RESOURCE_EXHAUSTED (as Triton's would); the listener goes on."""
    huge = infer_message("identity", "huge", INPUT0=np.zeros(5 << 20, np.uint8))
    with pytest.raises(grpc.RpcError) as caught:
        raw_stream(gateway.url("grpc"), [huge])
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    replies = raw_stream(gateway.url("grpc"), [infer_message("identity", "small", INPUT0=np.zeros(4, np.uint8))])
    assert [r.infer_response.id for r in replies] == ["small"]


def test_decoupled_model_over_unary_infer_is_refused(gateway: GatewayProcess) -> None:
    with grpcclient.InferenceServerClient(gateway.url("grpc")) as client:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("repeat_int32", repeat_inputs([1]))
        # What clients read to know they must open a stream (Triton's config field).
        assert client.get_model_config("repeat_int32").config.model_transaction_policy.decoupled is True
        assert client.get_model_config("simple").config.model_transaction_policy.decoupled is False
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in caught.value.message()


def test_sequence_requests_run_in_order_others_at_once(gateway: GatewayProcess) -> None:
    slow = dict(IN=np.array([1], np.int32), DELAY=np.array([400], np.uint32), WAIT=np.array([0], np.uint32))
    fast = dict(IN=np.array([2], np.int32), DELAY=np.array([0], np.uint32), WAIT=np.array([0], np.uint32))
    same = raw_stream(gateway.url("grpc"), [infer_message("repeat_int32", "a", {"sequence_id": 7}, **slow),
                                            infer_message("repeat_int32", "b", {"sequence_id": 7}, **fast)])
    assert [r.infer_response.id for r in same] == ["a", "b"]
    other = raw_stream(gateway.url("grpc"), [infer_message("repeat_int32", "a", {"sequence_id": 7}, **slow),
                                             infer_message("repeat_int32", "b", {"sequence_id": 8}, **fast)])
    assert [r.infer_response.id for r in other] == ["b", "a"]


def stream_metrics(gateway: GatewayProcess) -> tuple[float, float]:
    samples = scrape_metrics(gateway)
    return (metric_value(samples, "gateway_open_streams", listener="grpc"),
            metric_value(samples, "gateway_requests_in_flight", listener="grpc"))


def test_cancel_mid_stream_ends_the_upstream_calls(gateway: GatewayProcess) -> None:
    before = metric_value(scrape_metrics(gateway), "gateway_requests_total", operation="stream_infer",
                          outcome="cancelled")
    message = infer_message("repeat_int32", "long", IN=np.arange(20, dtype=np.int32),
                            DELAY=np.full(20, 300, np.uint32), WAIT=np.array([0], np.uint32))
    with grpc.insecure_channel(gateway.url("grpc")) as channel:
        call = channel.stream_stream(STREAM_METHOD, request_serializer=None,
                                     response_deserializer=pb.ModelStreamInferResponse.FromString)
        hold = threading.Event()

        def requests() -> Iterator[bytes]:
            yield message
            hold.wait(30)  # the stream stays open until the test cancels it

        responses = call(requests(), timeout=30)
        first = next(responses)
        assert first.infer_response.id == "long"
        assert stream_metrics(gateway) == (1.0, 1.0)
        responses.cancel()
        hold.set()
    wait_for(lambda: stream_metrics(gateway) == (0.0, 0.0), 10, "the stream and its request to end")
    wait_for(lambda: metric_value(scrape_metrics(gateway), "gateway_requests_total", operation="stream_infer",
                                  outcome="cancelled") == before + 1, 10, "the cancelled request to be counted")


def test_slow_reader_slows_its_producers(gateway: GatewayProcess) -> None:
    """64 requests of 1 MiB each to `identity`: while the client reads
    nothing, only a bounded number get answered (in-flight limit, response
    buffer, the transport's window); once it reads, all arrive."""
    count = 64
    big = np.zeros(1 << 20, dtype=np.uint8)
    messages = [infer_message("identity", f"m{i}", INPUT0=big) for i in range(count)]

    def answered() -> float:
        return metric_value(scrape_metrics(gateway), "gateway_requests_total", operation="stream_infer",
                            model="identity")

    before = answered()
    with grpc.insecure_channel(gateway.url("grpc"), options=[("grpc.max_receive_message_length", 64 << 20)]) \
            as channel:
        call = channel.stream_stream(STREAM_METHOD, request_serializer=None,
                                     response_deserializer=pb.ModelStreamInferResponse.FromString)
        responses = call(iter(messages), timeout=60)
        counts = [-1.0]

        def settled() -> bool:  # unread: the gateway must stop answering soon
            time.sleep(1.0)
            counts.append(answered() - before)
            return counts[-1] == counts[-2]

        wait_for(settled, 15, "the gateway to stop answering a reader that reads nothing")
        assert counts[-1] < count / 2
        ids = [r.infer_response.id for r in responses]
    assert sorted(ids) == sorted(f"m{i}" for i in range(count))


def test_open_streams_are_limited(gateway: GatewayProcess) -> None:
    hold = threading.Event()
    ping = infer_message("repeat_int32", "ping", IN=np.array([1], np.int32), DELAY=np.array([0], np.uint32),
                         WAIT=np.array([0], np.uint32))

    def requests() -> Iterator[bytes]:
        yield ping
        hold.wait(30)

    with grpc.insecure_channel(gateway.url("grpc")) as channel:
        call = channel.stream_stream(STREAM_METHOD, request_serializer=None,
                                     response_deserializer=pb.ModelStreamInferResponse.FromString)
        open_calls = [call(requests(), timeout=30) for _ in range(4)]
        try:
            for responses in open_calls:
                assert next(responses).infer_response.id == "ping"
            with pytest.raises(grpc.RpcError) as caught:
                list(call(iter([ping]), timeout=10))
            assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "limits.max_open_streams" in (caught.value.details() or "")
        finally:
            hold.set()
            for responses in open_calls:
                responses.cancel()
    wait_for(lambda: stream_metrics(gateway) == (0.0, 0.0), 10, "the streams to close")


def test_aio_stream(gateway: GatewayProcess) -> None:
    async def run() -> list[tuple[str, int]]:
        async with aioclient.InferenceServerClient(gateway.url("grpc")) as client:
            async def requests() -> Any:
                yield {"model_name": "repeat_int32", "inputs": repeat_inputs([3, 4], module=aioclient),
                       "request_id": "x"}
                a = np.ones((1, 16), dtype=np.int32)
                yield {"model_name": "simple", "inputs": simple_inputs(a, a), "request_id": "y"}

            got = []
            async for result, error in client.stream_infer(requests()):
                assert error is None
                response = result.get_response()
                value = int(result.as_numpy("OUT")[0]) if response.model_name == "repeat_int32" \
                    else int(result.as_numpy("OUTPUT0")[0, 0])
                got.append((response.id, value))
                if len(got) == 3:
                    break
            return got

    got = asyncio.run(asyncio.wait_for(run(), 30))
    assert sorted(got) == [("x", 3), ("x", 4), ("y", 2)]


def test_triton_custom_repeat_example_unmodified(gateway: GatewayProcess) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLES / "simple_grpc_custom_repeat.py"), "-u",
                           gateway.url("grpc")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS: Decoupled API" in done.stdout


def test_gateway_log_is_clean(gateway: GatewayProcess) -> None:
    assert "Traceback" not in gateway.log()


# --- a unary V2 gRPC upstream: MLServer ---------------------------------------------


@pytest.fixture(scope="module")
def ml_gateway(mlserver: MLServerPeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("stream-mlserver")
    text = f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: mlserver, protocol: v2-grpc, endpoints: ["{mlserver.grpc_address}"]}}
routes:
  - match: {{model: "*"}}
    upstream: mlserver
"""
    with GatewayProcess(write_config(directory, text), directory / "gateway.log") as gw:
        yield gw


def test_stream_to_mlserver_grpc(ml_gateway: GatewayProcess) -> None:
    stream = Stream(ml_gateway.url("grpc"))
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        stream.client.async_stream_infer("simple", simple_inputs(a, a), request_id="m1",
                                         enable_empty_final_response=True)
        stream.client.async_stream_infer("no_such_model", simple_inputs(a, a), request_id="m2")
        stream.client.async_stream_infer("simple", simple_inputs(a, 2 * a), request_id="m3")
        results = [stream.next(20) for _ in range(4)]
        errors = [error for _, error in results if error is not None]
        assert len(errors) == 1 and "no_such_model" in str(errors[0])
        ok: dict[str, list[Any]] = {}
        for r, e in results:
            if e is None:
                ok.setdefault(r.get_response().id, []).append(r)
        assert sorted(ok) == ["m1", "m3"]
        np.testing.assert_array_equal(ok["m3"][0].as_numpy("OUTPUT0"), 3 * a)
        assert [final_flag(r) for r in ok["m3"]] == [True]  # MLServer's stream ended: its one answer is final
        # m1 asked for the empty final response: its answer went on at once, the end came after.
        np.testing.assert_array_equal(ok["m1"][0].as_numpy("OUTPUT0"), 2 * a)
        assert [final_flag(r) for r in ok["m1"]] == [False, True] and not ok["m1"][1].get_response().outputs
        with pytest.raises(queue.Empty):
            stream.next(timeout=0.3)
    finally:
        stream.close()
    assert "Traceback" not in ml_gateway.log()

