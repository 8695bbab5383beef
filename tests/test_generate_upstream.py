"""The V2 REST upstream's ``streaming: generate_stream`` (Triton's flat
generate object both ways), over real sockets: a second copy of this
gateway serving the builtin models with its V2 REST listener is the
Triton-form generate_stream peer (no Triton server runs here).
tritonclient.grpc streams and a raw SSE client go through the front gateway
to it; values, datatypes and shapes come back as the model made them; an
error event mid-stream and an unknown model reach the client in its own
form."""

from __future__ import annotations

import json
import queue
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from stream_client import Stream, final_flag, repeat_inputs

from gateway.core.types import Tensor, TensorSpec
from gateway.protocols.v2_rest.flat import encode_flat_request, flat_answer_items
from peers.threaded_http import ThreadedStandin
from support import GatewayProcess, write_config

BACK_CONFIG = """
admin: {address: "127.0.0.1:0"}
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
upstreams:
  - {name: local, protocol: builtin}
routes:
  - match: {model: slow_repeat}
    upstream: local
    rewrite: {model: repeat_int32}
    timeout: 1s
  - match: {model: "*"}
    upstream: local
"""
ROW = list(range(16))


@pytest.fixture(scope="module")
def back(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A second copy of this gateway, standing in for Triton's generate_stream."""
    directory = tmp_path_factory.mktemp("generate-back")
    with GatewayProcess(write_config(directory, BACK_CONFIG), directory / "gateway.log") as gw:
        yield gw


FAKE_METADATA = {"name": "fake", "versions": ["1"], "platform": "test",
                 "inputs": [{"name": "IN", "datatype": "INT32", "shape": [-1]}],
                 "outputs": [{"name": "OUT", "datatype": "FP32", "shape": [-1, 2]},
                             {"name": "NAME", "datatype": "BYTES", "shape": [1]}]}
# Its events: one answer, then an error whose words name an address.
FAKE_EVENTS = (b'data: {"model_name": "fake", "model_version": "1", "OUT": [1.5, 2, 3, 4], "NAME": "x", "more": 1}'
               b'\n\ndata: {"error": "model crashed talking to 10.1.2.3:9000"}\n\n')


class FakePeer(BaseHTTPRequestHandler):
    """A scripted generate_stream server: its metadata, and a stream that
    answers once and then fails; it keeps the bodies it was sent."""

    bodies: ClassVar[list[Any]] = []

    def log_message(self, *_: Any) -> None:
        pass

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def do_GET(self) -> None:
        if self.path == "/v2/models/fake":
            self._send(200, "application/json", json.dumps(FAKE_METADATA).encode())
        else:
            self._send(404, "application/json", b'{"error": "unknown"}')

    def do_POST(self) -> None:
        FakePeer.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self._send(200, "text/event-stream", FAKE_EVENTS)


@pytest.fixture(scope="module")
def fake_peer() -> Iterator[str]:
    server = ThreadedStandin(FakePeer).start()
    try:
        yield server.address
    finally:
        server.stop()


@pytest.fixture(scope="module")
def front(back: GatewayProcess, fake_peer: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("generate-front")
    text = f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: back, protocol: v2-rest, endpoints: ["{back.url('rest')}"], streaming: generate_stream}}
  - {{name: fake, protocol: v2-rest, endpoints: ["{fake_peer}"], streaming: generate_stream}}
routes:
  - match: {{model: fake}}
    upstream: fake
  - match: {{model: "*"}}
    upstream: back
"""
    with GatewayProcess(write_config(directory, text), directory / "gateway.log") as gw:
        yield gw


def tensor(name: str, values: Any, datatype: str) -> grpcclient.InferInput:
    array = np.array(values, dtype=object if datatype == "BYTES" else grpcclient.triton_to_np_dtype(datatype))
    item = grpcclient.InferInput(name, list(array.shape), datatype)
    item.set_data_from_numpy(array)
    return item


def described(result: Any) -> dict[str, tuple[str, list[int], list[Any]]]:
    """Each output's datatype, shape and values, as the client got them."""
    outputs = result.get_response().outputs
    return {o.name: (o.datatype, list(o.shape), result.as_numpy(o.name).reshape(-1).tolist()) for o in outputs}


# --- tritonclient.grpc stream -> front -> back's generate_stream ----------------------------


def test_a_decoupled_model_answers_in_order(front: GatewayProcess) -> None:
    with Stream(front.url("grpc")) as stream:
        stream.client.async_stream_infer("repeat_int32", repeat_inputs([4, -5, 6, 70000]), request_id="r1")
        results = [stream.next() for _ in range(4)]
        assert all(error is None for _, error in results), [error for _, error in results]
        got = [result for result, _ in results]
        assert [described(r) for r in got] == [{"OUT": ("INT32", [1], [value]), "IDX": ("UINT32", [1], [index])}
                                               for index, value in enumerate([4, -5, 6, 70000])]
        assert [final_flag(r) for r in got] == [False, False, False, True]
        assert {r.get_response().id for r in got} == {"r1"}
        assert got[0].get_response().model_name == "repeat_int32"
        with pytest.raises(queue.Empty):
            stream.next(timeout=0.5)


def test_a_unary_model_answers_once_with_its_shapes(front: GatewayProcess) -> None:
    with Stream(front.url("grpc")) as stream:
        stream.client.async_stream_infer("simple", [tensor("INPUT0", [ROW], "INT32"),
                                                    tensor("INPUT1", [[3] * 16], "INT32")])
        result, error = stream.next()
        assert error is None, error
        assert described(result) == {"OUTPUT0": ("INT32", [1, 16], [v + 3 for v in ROW]),
                                     "OUTPUT1": ("INT32", [1, 16], [v - 3 for v in ROW])}
        assert final_flag(result) is True
        # Strings go as JSON strings and come back as BYTES.
        stream.client.async_stream_infer("identity", [tensor("INPUT0", ["a", "bc", "ü"], "BYTES")])
        result, error = stream.next()
        assert error is None, error
        assert described(result) == {"OUTPUT0": ("BYTES", [3], [b"a", b"bc", "ü".encode()])}


def test_an_error_event_mid_stream_is_the_requests_error(front: GatewayProcess) -> None:
    """The back's route times out after 1 s: its second response (2 s late)
    never comes, and its error event ends the request; the stream goes on."""
    with Stream(front.url("grpc")) as stream:
        stream.client.async_stream_infer("slow_repeat", repeat_inputs([1, 2], [0, 2000]), request_id="slow")
        first, error = stream.next()
        assert error is None and described(first)["OUT"] == ("INT32", [1], [1])
        _, error = stream.next()
        assert error is not None and "did not answer within" in str(error), error
        assert "127.0.0.1" not in str(error)
        stream.client.async_stream_infer("repeat_int32", repeat_inputs([3]), request_id="after")
        result, error = stream.next()
        assert error is None and described(result)["OUT"] == ("INT32", [1], [3])


def test_an_unknown_model(front: GatewayProcess) -> None:
    with Stream(front.url("grpc")) as stream:
        stream.client.async_stream_infer("no_such_model", repeat_inputs([1]))
        _, error = stream.next()
        assert error is not None and "no_such_model" in str(error) and "127.0.0.1" not in str(error), error


def test_the_wire_both_ways_and_an_error_without_its_address(front: GatewayProcess) -> None:
    """Against a scripted peer: the request is the flat object (parameters
    apart), the answer's outputs take the declared datatypes and shapes
    (fields that are no output are dropped), the error keeps its words but
    not the address in them."""
    FakePeer.bodies.clear()
    with Stream(front.url("grpc")) as stream:
        stream.client.async_stream_infer("fake", [tensor("IN", [5], "INT32")], parameters={"IN": "a parameter"},
                                         sequence_id=9, sequence_start=True)
        result, error = stream.next()
        assert error is None, error
        assert described(result) == {"OUT": ("FP32", [2, 2], [1.5, 2.0, 3.0, 4.0]), "NAME": ("BYTES", [1], [b"x"])}
        _, error = stream.next()
        assert error is not None and "model crashed talking to" in str(error), error
        assert "10.1.2.3" not in str(error)
    assert FakePeer.bodies == [{"IN": 5, "parameters": {"IN": "a parameter", "sequence_id": 9,
                                                         "sequence_start": True, "sequence_end": False}}]


# --- a raw SSE client -> front's generate_stream -> back's generate_stream ----------------------


def sse_post(gateway: GatewayProcess, model: str, body: Any) -> tuple[int, bytes]:
    """A raw HTTP/1.1 POST to the REST listener: the status and the
    (de-chunked) body."""
    payload = json.dumps(body).encode()
    head = (f"POST /v2/models/{model}/generate_stream HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    host, port = gateway.url("rest").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + payload)
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
    head_text, _, rest = data.partition(b"\r\n\r\n")
    lines = head_text.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding") != "chunked":
        return int(lines[0].split()[1]), rest
    out = b""
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return int(lines[0].split()[1]), out
        out, rest = out + rest[:size], rest[size + 2:]


def events(body: bytes) -> list[dict[str, Any]]:
    assert body.endswith(b"\n\n"), body[-100:]
    found = []
    for block in body[:-2].split(b"\n\n"):
        assert block.startswith(b"data: ") and b"\n" not in block, block
        found.append(json.loads(block[len(b"data: "):]))
    return found


def test_raw_sse_through_two_generate_streams(front: GatewayProcess) -> None:
    status, body = sse_post(front, "repeat_int32", {"IN": [1, 2, 3], "DELAY": [0, 0, 0], "WAIT": 0})
    assert status == 200
    assert events(body) == [{"model_name": "repeat_int32", "model_version": "1", "OUT": value, "IDX": index}
                            for index, value in enumerate([1, 2, 3])]
    status, body = sse_post(front, "simple", {"INPUT0": ROW, "INPUT1": [1] * 16})
    assert status == 200
    assert events(body) == [{"model_name": "simple", "model_version": "1",
                             "OUTPUT0": [v + 1 for v in ROW], "OUTPUT1": [v - 1 for v in ROW]}]
    status, body = sse_post(front, "repeat_int32", {"IN": [], "DELAY": [], "WAIT": 0})
    assert status == 200 and body == b""


def test_raw_sse_errors(front: GatewayProcess) -> None:
    status, body = sse_post(front, "slow_repeat", {"IN": [1, 2], "DELAY": [0, 2000], "WAIT": 0})
    assert status == 200
    first, error = events(body)
    assert (first["OUT"], first["IDX"]) == (1, 0)
    assert list(error) == ["error"] and "did not answer within" in error["error"] and "127.0.0.1" not in error["error"]
    status, body = sse_post(front, "no_such_model", {"IN": [1], "DELAY": [0], "WAIT": 0})
    assert status == 404 and "no_such_model" in json.loads(body)["error"]


# --- the mapping itself (gateway/protocols/v2_rest/flat.py) -----------------------------------


def test_a_request_as_a_flat_object_and_an_answer_back() -> None:
    inputs = [Tensor("A", "FP32", (1, 2), np.array([[0.5, 2.0]], dtype=np.float32)),
              Tensor("B", "BYTES", (1,), np.array([b"text"], dtype=object))]
    body = json.loads(encode_flat_request(inputs, {"sequence_id": 7, "A": "a parameter"}))
    assert body == {"A": [0.5, 2.0], "B": "text", "parameters": {"sequence_id": 7, "A": "a parameter"}}
    specs = (TensorSpec("X", "UINT8", (-1, 2)), TensorSpec("Y", "BYTES", (-1,)))
    answer = {"model_name": "m", "model_version": "1", "X": [1, 2, 3, 4], "Y": "s", "extra": 1}
    assert flat_answer_items(answer, specs) == [
        {"name": "X", "datatype": "UINT8", "shape": [2, 2], "data": [1, 2, 3, 4]},
        {"name": "Y", "datatype": "BYTES", "shape": [1], "data": ["s"]}]
    # A model that declares no outputs: each other field, its datatype read from the JSON.
    assert [(i["name"], i["datatype"], i["shape"]) for i in flat_answer_items(answer, ())] == [
        ("X", "INT64", [4]), ("Y", "BYTES", [1]), ("extra", "INT64", [1])]
