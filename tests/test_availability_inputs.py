"""Every hostile input is answered in the protocol's own error form and
logged: JSON only Python's json reads (lone surrogates,
integers beyond 64 bits next to NaN), non-UTF-8 header bytes on every
listener, shapes numpy cannot hold, duplicate JSON keys on a pass-through,
and decode errors under the URL's model label.

One gateway process serves every listener; a V2 REST stand-in (a thread of
this process) is the upstream of the ``relay*`` models. Bad header bytes go
out on raw sockets (HTTP) and raw HTTP/2 frames (gRPC), which no client
library sends.
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from graphstorm_payloads import TARGET_MODEL, movielens

from gateway.protocols.v2_grpc import messages as pb
from peers.recording_upstream import RecordingUpstream as Recorder
from peers.rest_standin import Answer, RecordingUpstream
from support import GatewayProcess, metric_value, scrape_metrics, wait_for, write_config

TOKEN = "grpc-test-token"
CONFIG = """
admin: {{address: "127.0.0.1:0"}}
observability:
  access_log: {{format: json, destination: "{log}"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
  - {{name: grpc_auth, protocol: v2-grpc, address: "127.0.0.1:0", auth: {{token: {{env: GW_TEST_TOKEN}}}}}}
  - {{name: umb, protocol: umbridge, address: "127.0.0.1:0"}}
  - {{name: gs, protocol: graphstorm, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin}}
  - {{name: standin, protocol: v2-rest, endpoints: ["{standin}"], binary: never}}
  - {{name: recorder, protocol: v2-grpc, endpoints: ["{recorder}"]}}
routes:
  - match: {{model: via-grpc}}
    upstream: recorder
    forward_headers: [x-tenant]
  - match: {{model: "relay*"}}
    upstream: standin
  - match: {{model: "*"}}
    upstream: local
"""
IDENTITY = "/v2/models/identity/infer"
JSON = {"Content-Type": "application/json"}
# An answer with a lone surrogate, readable only by Python's json (the NaN sends it there).
SURROGATE_ANSWER = b'{"model_name": "relay", "outputs": [{"name": "\\ud800", "datatype": "FP32", "shape": [1], ' \
                   b'"data": [NaN]}]}'


class Gateway:
    def __init__(self, process: GatewayProcess, access_log: Path, standin: RecordingUpstream,
                 recorder: Recorder) -> None:
        self.process = process
        self.access_log = access_log
        self.standin = standin
        self.recorder = recorder

    def port(self, listener: str) -> int:
        return self.process.ports[listener]

    def post(self, listener: str, path: str, body: bytes, headers: dict[str, str] | None = None
             ) -> tuple[int, dict[str, str], Any]:
        """Status, headers (lower-case names) and JSON answer; header values
        are sent as latin-1, so "\\xff" is the byte 0xff."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port(listener), timeout=10)
        try:
            connection.request("POST", path, body=body, headers={**JSON, **(headers or {})})
            reply = connection.getresponse()
            data = reply.read()
        finally:
            connection.close()
        assert reply.getheader("Content-Type") == "application/json", data[:300]
        # Python's json: a GraphStorm answer may echo a lone surrogate escape
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, json.loads(data)

    def log_line(self, request_id: str) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            text = self.access_log.read_text() if self.access_log.exists() else ""
            return next((line for line in map(json.loads, text.splitlines()) if line["request_id"] == request_id),
                        None)

        return wait_for(find, 5, f"the access-log line of {request_id}")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    directory = tmp_path_factory.mktemp("inputs")
    standin = RecordingUpstream(binary=False).start()
    standin.answers = {"relay-surrogate": Answer(SURROGATE_ANSWER)}
    standin.metadata = {
        name: orjson.dumps({"name": name, "platform": "standin", "versions": ["1"],
                            "inputs": [{"name": "x", "datatype": "FP64", "shape": shape}],
                            "outputs": [{"name": "y", "datatype": "FP64", "shape": [-1, 1]}]})
        for name, shape in (("relay-many-dims", [-1] + [1] * 64), ("relay-huge-shape", [-1, 2 ** 62, 4, 0]))}
    access_log = directory / "access.log"
    with Recorder(directory) as recorder:
        config = write_config(directory, CONFIG.format(log=access_log, standin=standin.address,
                                                       recorder=recorder.address("grpc")))
        process = GatewayProcess(config, directory / "gateway.log", extra_env={"GW_TEST_TOKEN": TOKEN})
        with process:
            yield Gateway(process, access_log, standin, recorder)
    standin.stop()
    assert "Traceback" not in process.log(), process.log()[-3000:]


def identity_body(**fields: Any) -> bytes:
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0], **fields}
    return orjson.dumps({"inputs": [tensor]})


# --- JSON only Python's json reads -----------------------------------------------------

# NaN makes the gateway read the body with Python's json (for Triton's
# literals), which also takes what orjson refuses: all must stay 400s.
PYTHON_ONLY_JSON = {
    "surrogate tensor name": b'{"inputs": [{"name": "\\ud800", "datatype": "FP32", "shape": [1], "data": [NaN]}]}',
    "surrogate BYTES element": b'{"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1], '
                               b'"data": ["\\udfff"]}], "parameters": {"x": NaN}}',
    "surrogate parameter": b'{"parameters": {"p": "a\\ud800"}, "inputs": [{"name": "INPUT0", "datatype": "FP32", '
                           b'"shape": [1], "data": [Infinity]}]}',
    "surrogate id": b'{"id": "\\udc00", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], '
                    b'"data": [-Infinity]}]}',
    "integer beyond a double": b'{"parameters": {"p": 1' + b"0" * 400 + b'}, "inputs": [{"name": "INPUT0", '
                               b'"datatype": "FP32", "shape": [1], "data": [NaN]}]}',
}


@pytest.mark.parametrize("body", PYTHON_ONLY_JSON.values(), ids=PYTHON_ONLY_JSON.keys())
def test_v2_rest_json_python_alone_reads_is_a_logged_400(gateway: Gateway, body: bytes) -> None:
    status, headers, answer = gateway.post("rest", IDENTITY, body)
    assert status == 400, answer
    assert set(answer) == {"error"} and "not valid JSON" in answer["error"]
    line = gateway.log_line(headers["x-request-id"])
    assert (line["status"], line["outcome"], line["model"]) == ("400", "malformed_request", "identity")


def test_nan_literals_still_read(gateway: Gateway) -> None:
    """Triton's literals stay accepted (docs/protocols.md): only what no
    encoder can write is refused."""
    body = b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": [NaN, Infinity, 1]}]}'
    status, _, answer = gateway.post("rest", IDENTITY, body)
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [None, None, 1.0]  # JSON has no NaN: written as null


def test_upstream_reply_python_alone_reads_is_502(gateway: Gateway) -> None:
    status, _, answer = gateway.post("rest", "/v2/models/relay-surrogate/infer", identity_body())
    assert status == 502, answer
    assert set(answer) == {"error"} and "surrogate" in answer["error"]


@pytest.mark.parametrize("path", ["/Evaluate", "/InputSizes", "/ModelInfo"])
def test_umbridge_surrogate_model_name_is_invalid_input(gateway: Gateway, path: str) -> None:
    status, headers, answer = gateway.post("umb", path, b'{"name": "\\ud800", "input": [[1.0, 2.0], [3.0]]}')
    assert status == 400, answer
    assert answer["error"]["type"] == "InvalidInput"
    assert gateway.log_line(headers["x-request-id"])["status"] == "400"


def test_umbridge_surrogate_in_config_is_invalid_input(gateway: Gateway) -> None:
    status, _, answer = gateway.post("umb", "/InputSizes", b'{"name": "forward", "config": {"\\ud800": 1}}')
    assert status == 400 and answer["error"]["type"] == "InvalidInput", answer


def test_graphstorm_surrogate_ids_are_answered(gateway: Gateway) -> None:
    """GraphStorm's own parser (Python's json) reads lone surrogates, so the
    gateway does too; its answer echoes them as GraphStorm writes them."""
    body = orjson.dumps(movielens([("movie", "m1")])).replace(b'"m1"', b'"PLACEHOLDER"')
    body = body.replace(b'"PLACEHOLDER"', b'"\\ud800"')
    status, _, answer = gateway.post("gs", "/invocations", body)
    assert status == 200
    assert answer["status_code"] == 200, answer
    assert answer["data"]["results"][0]["node_id"] == "\ud800"


# --- non-UTF-8 header bytes ----------------------------------------------------------------


def test_graphstorm_target_model_header_with_byte_ff(gateway: Gateway) -> None:
    status, headers, answer = gateway.post("gs", "/invocations", orjson.dumps(movielens()),
                                           {TARGET_MODEL: "gnn\xff"})
    assert status == 200
    assert answer["status_code"] == 400 and "not valid Unicode" in answer["error"], answer
    assert gateway.log_line(headers["x-request-id"])["status"] == "400"


BAD_HEADERS = {
    "rest": (IDENTITY, identity_body(), [("Content-Encoding", "gz\xffip"), ("Inference-Header-Content-Length", "\xff"),
                                         ("X-Request-Id", "\xff"), ("Traceparent", "\xff"), ("X-Other", "\xff")]),
    "umb": ("/Evaluate", b'{"name": "forward", "input": [[1.0, 2.0], [3.0]]}',
            [("Content-Encoding", "\xff"), ("X-Request-Id", "\xfe\xff"), ("X-Other", "\xff")]),
    "gs": ("/invocations", orjson.dumps(movielens()), [("Content-Encoding", "\xff"), ("Content-Type", "\xff"),
                                                         ("X-Other", "\xff")]),
}


@pytest.mark.parametrize("listener", BAD_HEADERS)
def test_http_headers_with_non_utf8_bytes(gateway: Gateway, listener: str) -> None:
    """A header the gateway reads answers in the protocol's form; others are
    ignored. Never a 500."""
    path, body, headers = BAD_HEADERS[listener]
    for name, value in headers:
        status, reply_headers, answer = gateway.post(listener, path, body, {name: value})
        code = answer["status_code"] if listener == "gs" else status
        assert code != 500, (name, answer)
        if listener == "umb" and code >= 400:
            assert set(answer["error"]) == {"type", "message"}, answer
        elif listener == "rest" and code >= 400:
            assert set(answer) == {"error"}
        assert gateway.log_line(reply_headers["x-request-id"])["status"] != "500"


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _hpack_literal(name: bytes, value: bytes) -> bytes:
    """A literal header field without indexing, new name, no Huffman code."""
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def raw_grpc_status(port: int, message: bytes, metadata: list[tuple[bytes, bytes]]) -> int:
    """The grpc-status of one ModelInfer sent as raw HTTP/2 frames (grpcio
    refuses to send non-UTF-8 metadata; grpc core answers it in plain text)."""
    fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", pb.method_path("ModelInfer").encode()),
              (b":authority", b"127.0.0.1"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
              *metadata]
    block = b"".join(_hpack_literal(n, v) for n, v in fields)
    data = b"\x00" + struct.pack(">I", len(message)) + message
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _h2_frame(4, 0, 0, b"") + _h2_frame(1, 4, 1, block)
                     + _h2_frame(0, 1, 1, data))
        buffer = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            assert chunk, "the gateway closed the connection without an answer"
            buffer += chunk
            while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                length, kind, flags = int.from_bytes(buffer[:3], "big"), buffer[3], buffer[4]
                payload, buffer = buffer[9:9 + length], buffer[9 + length:]
                if kind == 4 and not flags & 1:  # SETTINGS: acknowledge
                    sock.sendall(_h2_frame(4, 1, 0, b""))
                assert kind != 3, "the gateway reset the stream"
                if kind == 1 and flags & 1 and b"grpc-status" in payload:  # trailers
                    after = payload[payload.index(b"grpc-status") + len(b"grpc-status"):]
                    return int(after[1:1 + after[0]])
        raise TimeoutError("no grpc-status within 5 s")


@pytest.mark.parametrize("name", [b"x-other", b"x-request-id", b"traceparent", b"authorization"])
def test_grpc_metadata_with_non_utf8_bytes(gateway: Gateway, name: bytes) -> None:
    """grpc hands such values over as bytes; the gateway ignores them (a
    missing credential is refused as one)."""
    request = pb.ModelInferRequest(model_name="identity")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    message = request.SerializeToString()
    assert raw_grpc_status(gateway.port("grpc"), message, [(name, b"\xff\xfe")]) == grpc.StatusCode.OK.value[0]
    auth = [(b"authorization", f"Bearer {TOKEN}".encode())] if name != b"authorization" else []
    expected = grpc.StatusCode.UNAUTHENTICATED if name == b"authorization" else grpc.StatusCode.OK
    assert raw_grpc_status(gateway.port("grpc_auth"), message, [*auth, (name, b"Bearer \xff")]) == expected.value[0]


def test_forwarded_header_a_grpc_upstream_cannot_carry(gateway: Gateway) -> None:
    """gRPC metadata is printable ASCII: a forwarded header that is not
    (non-UTF-8 bytes, or UTF-8 text) stays behind instead of failing the call."""
    for value in ("\xff", "\xc3\xa9"):  # sent as these bytes: not UTF-8, and "é"
        status, headers, answer = gateway.post("rest", "/v2/models/via-grpc/infer", identity_body(),
                                               {"X-Tenant": value})
        assert status == 200, answer
        call = gateway.recorder.call_with("x-request-id", headers["x-request-id"])
        assert "x-tenant" not in call["headers"]
    _, headers, _ = gateway.post("rest", "/v2/models/via-grpc/infer", identity_body(), {"X-Tenant": "acme"})
    assert gateway.recorder.call_with("x-request-id", headers["x-request-id"])["headers"]["x-tenant"] == "acme"


# --- shapes numpy cannot hold ------------------------------------------------------------------

SHAPES = {"65 dimensions": [1] * 65, "33 dimensions": [1] * 33, "2**62 x 4 x 0": [2 ** 62, 4, 0]}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_v2_rest_json_and_binary_shapes(gateway: Gateway, shape: list[int]) -> None:
    data = [] if 0 in shape else [1.0]  # flat data: as valid as nested
    status, headers, answer = gateway.post("rest", IDENTITY, identity_body(shape=shape, data=data))
    assert status == 400 and set(answer) == {"error"}, answer
    assert gateway.log_line(headers["x-request-id"])["model"] == "identity"
    head = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape,
                                     "parameters": {"binary_data_size": 4 * len(data)}}]})
    status, _, answer = gateway.post("rest", IDENTITY, head + struct.pack(f"<{len(data)}f", *data),
                                     {"Content-Type": "application/octet-stream",
                                      "Inference-Header-Content-Length": str(len(head))})
    assert status == 400 and set(answer) == {"error"}, answer


@pytest.mark.parametrize("typed", [False, True], ids=["raw", "typed"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_v2_grpc_shapes(gateway: Gateway, shape: list[int], typed: bool) -> None:
    request = pb.ModelInferRequest(model_name="identity")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
    if 0 not in shape:
        if typed:
            tensor.contents.fp32_contents.append(1.0)
        else:
            request.raw_input_contents.append(struct.pack("<f", 1.0))
    with grpc.insecure_channel(f"127.0.0.1:{gateway.port('grpc')}") as channel:
        call = channel.unary_unary(pb.method_path("ModelInfer"),
                                   request_serializer=pb.ModelInferRequest.SerializeToString,
                                   response_deserializer=pb.ModelInferResponse.FromString)
        with pytest.raises(grpc.RpcError) as info:
            call(request, timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value.details()


@pytest.mark.parametrize("path", ["/InputSizes", "/Evaluate"])
@pytest.mark.parametrize("model", ["relay-many-dims", "relay-huge-shape"])
def test_umbridge_over_a_model_of_impossible_shape(gateway: Gateway, model: str, path: str) -> None:
    """UM-Bridge clients send no shapes; an upstream's metadata does, and a
    shape no tensor can have is the upstream's fault (InvalidOutput)."""
    status, _, answer = gateway.post("umb", path, orjson.dumps({"name": model, "input": [[1.0]]}))
    assert (status, answer["error"]["type"]) == (500, "InvalidOutput"), answer
    assert "shape" in answer["error"]["message"]


def test_graphstorm_feature_of_many_dimensions(gateway: Gateway) -> None:
    payload = movielens()
    for node in payload["graph"]["nodes"]:
        value: Any = node["features"]["feat"]
        for _ in range(40):
            value = [value]
        node["features"]["feat"] = value
    status, _, answer = gateway.post("gs", "/invocations", orjson.dumps(payload))
    assert status == 200
    assert answer["status_code"] == 411 and "dimensions" in answer["error"], answer


# --- duplicate keys on a pass-through ----------------------------------------------------------

def _first_key_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """How a reader that keeps the first of two keys sees an object."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        out.setdefault(key, value)
    return out


DUPLICATES = {
    "top-level inputs": b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": [666]}], '
                        b'"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": [1]}]}',
    "tensor data": b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": [666], "data": [1]}]}',
    "tensor shape": b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [2], "shape": [1], "data": [1]}]}',
    "escaped key": b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "\\u0064ata": [666], '
                   b'"data": [1]}]}',
    "escaped colon hides it": b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": [666], '
                              b'"data": [1]}], "parameters": {"p": "\\u003a"}}',
}


@pytest.mark.parametrize("body", DUPLICATES.values(), ids=DUPLICATES.keys())
def test_duplicate_keys_are_not_passed_through(gateway: Gateway, body: bytes) -> None:
    """What the gateway checked (the last key, as orjson reads it) is what
    the upstream gets, also when the upstream reads the first key."""
    model = f"relay-dup-{len(gateway.standin.seen)}"
    status, _, answer = gateway.post("rest", f"/v2/models/{model}/infer", body)
    assert status == 200, answer
    (seen,) = gateway.standin.seen_for(model)
    assert seen.body != body
    forwarded = json.loads(seen.body, object_pairs_hook=_first_key_wins)
    assert forwarded["inputs"] == [{"name": "A", "datatype": "INT32", "shape": [1], "data": [1]}]


def test_bodies_without_duplicates_pass_through_verbatim(gateway: Gateway) -> None:
    body = (b'{ "parameters": {"url": "http://a:b/c", "k:ey": "\\u00e9"}, "inputs": [ {"name": "A", '
            b'"datatype": "BYTES", "shape": [2], "data": ["x:y", "\\u003a"]} ] }')
    status, _, answer = gateway.post("rest", "/v2/models/relay-verbatim/infer", body)
    assert status == 200, answer
    (seen,) = gateway.standin.seen_for("relay-verbatim")
    assert seen.body == body


# --- decode errors carry the model label ---------------------------------------------------------


def test_decode_errors_carry_the_urls_model(gateway: Gateway) -> None:
    before = metric_value(scrape_metrics(gateway.process), "gateway_requests_total", listener="rest",
                          model="identity", outcome="malformed_request")
    status, headers, _ = gateway.post("rest", IDENTITY, b'{"inputs": 1}')
    assert status == 400
    assert gateway.log_line(headers["x-request-id"])["model"] == "identity"
    status, headers, _ = gateway.post("rest", IDENTITY, b"x" * 100, {"Content-Encoding": "gzip"})
    assert status == 400
    assert gateway.log_line(headers["x-request-id"])["model"] == "identity"
    after = metric_value(scrape_metrics(gateway.process), "gateway_requests_total", listener="rest",
                         model="identity", outcome="malformed_request")
    assert after == before + 2


def test_graphstorm_body_errors_carry_the_model(gateway: Gateway) -> None:
    _, headers, answer = gateway.post("gs", "/invocations", b'{"broken": ')
    assert answer["status_code"] == 400
    assert gateway.log_line(headers["x-request-id"])["model"] == "gnn"
