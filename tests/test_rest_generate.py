"""Triton's generate extension on the V2 REST listener, over real sockets:
raw HTTP and ``requests`` clients -> the gateway (its own process) -> the
builtin models (``simple``, ``identity``, the decoupled ``repeat_int32``)
and a real MLServer over a ``v2-rest`` upstream.

``generate`` answers one flat JSON object; ``generate_stream`` answers
Server-Sent Events, one per upstream response as it comes; errors before
the first event are ordinary V2 errors, after it an ``{"error"}`` event. A
reader that reads nothing holds the upstream back; one that hangs up ends
the upstream call.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from peers.mlserver import MLServerPeer
from support import GatewayProcess, metric_value, scrape_metrics, wait_for, write_config

CONFIG = """
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: classic, protocol: v2-rest, address: "127.0.0.1:0", fast_path: false}}
  - {{name: locked, protocol: v2-rest, address: "127.0.0.1:0", auth: {{token: {{env: GW_TEST_GENERATE_TOKEN}}}}}}
upstreams:
  - {{name: local, protocol: builtin}}
  - {{name: mls, protocol: v2-rest, endpoints: ["{mlserver}"]}}
routes:
  - match: {{model: slow_repeat}}
    upstream: local
    rewrite: {{model: repeat_int32}}
    timeout: {timeout}s
  - match: {{model: {long_name}}}
    upstream: local
    rewrite: {{model: repeat_int32}}
  - match: {{model: mls_simple}}
    upstream: mls
    rewrite: {{model: simple}}
  - match: {{model: mls_trig}}
    upstream: mls
    rewrite: {{model: trig_fp32}}
  - match: {{model: "*"}}
    upstream: local
"""
ROUTE_TIMEOUT = 1.0  # slow_repeat's
LONG_NAME = "repeat_" + "r" * 200
TOKEN = "s3cr3t-generate"  # repeat_int32 with ~270-byte events
ROW = list(range(16))
ONES = [1] * 16
SSE_TYPE = "text/event-stream; charset=utf-8"


@pytest.fixture(scope="module")
def gateway(mlserver: MLServerPeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("generate")
    config = CONFIG.format(mlserver=mlserver.rest_address, timeout=ROUTE_TIMEOUT, long_name=LONG_NAME)
    with GatewayProcess(write_config(directory, config), directory / "gateway.log",
                        extra_env={"GW_TEST_GENERATE_TOKEN": TOKEN}) as gw:
        yield gw


def url(gateway: GatewayProcess, model: str, route: str, listener: str = "rest") -> str:
    return f"http://{gateway.url(listener)}/v2/models/{model}/{route}"


def port(gateway: GatewayProcess, listener: str = "rest") -> int:
    return int(gateway.url(listener).rsplit(":", 1)[1])


# --- a raw HTTP/1.1 client -----------------------------------------------------


def raw_request(path: str, body: bytes, close: bool = True) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: gateway", "Content-Type: application/json",
             f"Content-Length: {len(body)}", *(["Connection: close"] if close else [])]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def split_reply(data: bytes) -> tuple[int, dict[str, str], bytes]:
    status, headers, body, _ = next_reply(data)
    return status, headers, body


def next_reply(data: bytes) -> tuple[int, dict[str, str], bytes, bytes]:
    """The first reply in ``data`` (Content-Length or chunked) and what follows it."""
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding") != "chunked":
        length = int(headers.get("content-length", len(rest)))
        return int(lines[0].split()[1]), headers, rest[:length], rest[length:]
    out = []
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return int(lines[0].split()[1]), headers, b"".join(out), rest[2:]
        out.append(rest[:size])
        rest = rest[size + 2:]


def raw_post(gateway: GatewayProcess, path: str, body: Any,
             listener: str = "rest") -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port(gateway, listener)), timeout=10) as sock:
        sock.sendall(raw_request(path, json.dumps(body).encode()))
        return split_reply(read_all(sock))


def events(body: bytes) -> list[dict[str, Any]]:
    """The events of an SSE body, each checked to be exactly ``data: <json>``."""
    assert body.endswith(b"\n\n"), body[-100:]
    found = []
    for block in body[:-2].split(b"\n\n"):
        assert block.startswith(b"data: ") and b"\n" not in block, block
        found.append(json.loads(block[len(b"data: "):]))
    return found


# --- generate ------------------------------------------------------------------


@pytest.mark.parametrize("listener", ["rest", "classic"])
def test_generate_simple_over_raw_http(gateway: GatewayProcess, listener: str) -> None:
    """Fields named like the inputs become INT32 [1, 16] tensors (the
    model's shape); the rest are parameters; outputs come back as fields."""
    status, headers, body = raw_post(gateway, "/v2/models/simple/generate",
                                     {"INPUT0": ROW, "INPUT1": ONES, "temperature": 0.5, "stream": False}, listener)
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    assert headers["x-request-id"]
    assert json.loads(body) == {"model_name": "simple", "model_version": "1",
                                "OUTPUT0": [v + 1 for v in ROW], "OUTPUT1": [v - 1 for v in ROW]}


def test_generate_identity_scalars_strings_and_lists(gateway: GatewayProcess) -> None:
    with requests.Session() as http:
        def generate(body: Any, model: str = "identity") -> Any:
            reply = http.post(url(gateway, model, "generate"), json=body, timeout=10)
            assert reply.status_code == 200, reply.text
            return reply.json()

        assert generate({"INPUT0": "hello"})["OUTPUT0"] == "hello"  # one element: a scalar
        assert generate({"INPUT0": ["a", "b"]})["OUTPUT0"] == ["a", "b"]
        assert generate({"INPUT0": [[1.5, 2], [3, 4]]})["OUTPUT0"] == [1.5, 2.0, 3.0, 4.0]  # flat, as Triton
        versioned = http.post(f"http://{gateway.url('rest')}/v2/models/identity/versions/1/generate",
                              json={"INPUT0": "v"}, timeout=10)
        assert versioned.json() == {"model_name": "identity", "model_version": "1", "OUTPUT0": "v"}


def test_generate_on_a_decoupled_model_takes_exactly_one_response(gateway: GatewayProcess) -> None:
    """As Triton: a decoupled model's one response is the answer; none or
    several are refused (400)."""
    one = requests.post(url(gateway, "repeat_int32", "generate"), json={"IN": [9], "DELAY": [0], "WAIT": 0},
                        timeout=10)
    assert one.status_code == 200 and one.json() == {"model_name": "repeat_int32", "model_version": "1",
                                                     "OUT": 9, "IDX": 0}
    for values, got in (([1, 2, 3], "produced more"), ([], "produced none")):
        reply = requests.post(url(gateway, "repeat_int32", "generate"),
                              json={"IN": values, "DELAY": [0] * len(values), "WAIT": 0}, timeout=10)
        assert reply.status_code == 400
        assert "generate expects model to produce exactly 1 response" in reply.json()["error"]
        assert got in reply.json()["error"]


def test_errors_in_the_v2_form(gateway: GatewayProcess) -> None:
    for route in ("generate", "generate_stream"):
        missing = requests.post(url(gateway, "nope", route), json={"INPUT0": "x"}, timeout=10)
        assert missing.status_code == 404 and missing.json() == {"error": "Request for unknown model: "
                                                                          "'nope' is not found"}
        bad = requests.post(url(gateway, "simple", route), json={"INPUT0": ["x"] * 16, "INPUT1": ONES}, timeout=10)
        assert bad.status_code == 400 and bad.headers["Content-Type"] == "application/json"
        assert bad.json() == {"error": "input 'INPUT0': INT32 data must be integers"}


# --- generate_stream -------------------------------------------------------------


def test_generate_stream_sends_each_response_as_it_comes(gateway: GatewayProcess) -> None:
    """Four responses, the last 2 s after the others: the first three arrive
    before it is made."""
    body = {"IN": [4, 5, 6, 7], "DELAY": [0, 0, 0, 2000], "WAIT": 0}
    started = time.monotonic()
    with requests.post(url(gateway, "repeat_int32", "generate_stream"), json=body, stream=True, timeout=10) as reply:
        assert reply.status_code == 200
        assert reply.headers["Content-Type"] == SSE_TYPE
        got, times = [], []
        for line in reply.iter_lines():
            if line:
                assert line.startswith(b"data: ")
                got.append(json.loads(line[6:]))
                times.append(time.monotonic() - started)
    assert got == [{"model_name": "repeat_int32", "model_version": "1", "OUT": value, "IDX": index}
                   for index, value in enumerate([4, 5, 6, 7])]
    assert times[2] < 1.5 <= times[3], times


def test_generate_stream_over_raw_http(gateway: GatewayProcess) -> None:
    status, headers, body = raw_post(gateway, "/v2/models/repeat_int32/generate_stream",
                                     {"IN": [1, 2, 3], "DELAY": [0, 0, 0], "WAIT": 0})
    assert status == 200 and headers["content-type"] == SSE_TYPE
    assert [(e["OUT"], e["IDX"]) for e in events(body)] == [(1, 0), (2, 1), (3, 2)]
    # A unary model: one event, the generate answer.
    status, _, body = raw_post(gateway, "/v2/models/simple/generate_stream", {"INPUT0": ROW, "INPUT1": ONES})
    assert status == 200
    assert events(body) == [{"model_name": "simple", "model_version": "1",
                             "OUTPUT0": [v + 1 for v in ROW], "OUTPUT1": [v - 1 for v in ROW]}]
    # No response at all: an empty stream.
    status, _, body = raw_post(gateway, "/v2/models/repeat_int32/generate_stream", {"IN": [], "DELAY": [], "WAIT": 0})
    assert status == 200 and body == b""


def test_an_error_after_the_first_event_is_an_event(gateway: GatewayProcess) -> None:
    """slow_repeat's route times out after 1 s: the second response (2 s
    late) never comes."""
    status, headers, body = raw_post(gateway, "/v2/models/slow_repeat/generate_stream",
                                     {"IN": [1, 2], "DELAY": [0, 2000], "WAIT": 0})
    assert status == 200 and headers["content-type"] == SSE_TYPE
    first, error = events(body)
    assert (first["OUT"], first["IDX"]) == (1, 0)
    assert list(error) == ["error"] and "did not answer within" in error["error"], error


def test_an_error_before_the_first_event_is_an_http_error(gateway: GatewayProcess) -> None:
    status, headers, body = raw_post(gateway, "/v2/models/slow_repeat/generate_stream",
                                     {"IN": [1], "DELAY": [2000], "WAIT": 0})
    assert status == 504 and headers["content-type"] == "application/json"
    assert "did not answer within" in json.loads(body)["error"]


def in_flight(gateway: GatewayProcess) -> tuple[float, float]:
    samples = scrape_metrics(gateway)
    return (metric_value(samples, "gateway_requests_in_flight", listener="rest"),
            metric_value(samples, "gateway_open_streams", listener="rest"))


def finished_streams(gateway: GatewayProcess) -> float:
    return metric_value(scrape_metrics(gateway), "gateway_stream_responses_per_request_count", listener="rest")


def test_a_slow_reader_holds_the_upstream_back(gateway: GatewayProcess) -> None:
    """Five pipelined streams of 10000 events (~2.7 MB each) to a client
    that reads nothing: the sockets hold about one stream (~3 MB on
    loopback), so the gateway must stop producing (its answers wait for the
    transport to drain) instead of buffering the others; once the client
    reads, every event arrives, in order."""
    count, streams = 10_000, 5
    body = json.dumps({"IN": list(range(count)), "DELAY": [0] * count, "WAIT": 0}).encode()
    path = f"/v2/models/{LONG_NAME}/generate_stream"
    before = finished_streams(gateway)
    with socket.create_connection(("127.0.0.1", port(gateway)), timeout=30) as sock:
        sock.sendall(b"".join(raw_request(path, body, close=i == streams - 1) for i in range(streams)))
        counts = [-1.0]

        def settled() -> bool:  # unread: the gateway must stop producing soon
            time.sleep(1.0)
            counts.append(finished_streams(gateway) - before)
            return counts[-1] == counts[-2]

        wait_for(settled, 30, "the gateway to stop producing for a reader that reads nothing")
        assert counts[-1] <= 2, counts
        assert in_flight(gateway)[0] == 1.0  # a stream, held back by its reader
        data = read_all(sock)
    for _ in range(streams):
        status, _, answer, data = next_reply(data)
        assert status == 200
        got = events(answer)
        assert [e["IDX"] for e in got] == list(range(count))
        assert [e["OUT"] for e in got] == list(range(count))
        assert got[0]["model_name"] == LONG_NAME
    assert data == b""
    wait_for(lambda: in_flight(gateway) == (0.0, 0.0), 10, "the streams to end")
    assert finished_streams(gateway) - before == streams


def test_a_client_that_hangs_up_ends_the_upstream_call(gateway: GatewayProcess) -> None:
    def cancelled() -> float:
        return metric_value(scrape_metrics(gateway), "gateway_requests_total", operation="generate_stream",
                            outcome="cancelled")

    before = cancelled()
    with socket.create_connection(("127.0.0.1", port(gateway)), timeout=10) as sock:
        body = json.dumps({"IN": [1, 2], "DELAY": [0, 8000], "WAIT": 0}).encode()
        sock.sendall(raw_request("/v2/models/repeat_int32/generate_stream", body))
        received = b""
        while b"\n\n" not in received:
            received += sock.recv(4096)
        assert b'"OUT":1' in received
        assert in_flight(gateway) == (1.0, 1.0)
    # Well before the second response was due (8 s): the call was cancelled.
    wait_for(lambda: in_flight(gateway) == (0.0, 0.0), 5, "the request to end with its client")
    wait_for(lambda: cancelled() == before + 1, 5, "the request to be counted as cancelled")


def test_requests_are_counted_under_their_operation(gateway: GatewayProcess) -> None:
    def total(operation: str) -> float:
        return metric_value(scrape_metrics(gateway), "gateway_requests_total", operation=operation, model="identity")

    before = (total("generate"), total("generate_stream"))
    for route in ("generate", "generate_stream"):
        assert requests.post(url(gateway, "identity", route), json={"INPUT0": "x"}, timeout=10).status_code == 200
    wait_for(lambda: (total("generate"), total("generate_stream")) == (before[0] + 1, before[1] + 1), 5,
             "both requests to be counted")


def test_a_listener_with_auth_guards_both_routes(gateway: GatewayProcess) -> None:
    body = {"IN": [3], "DELAY": [0], "WAIT": 0}
    for route in ("generate", "generate_stream"):
        refused = requests.post(url(gateway, "repeat_int32", route, "locked"), json=body, timeout=10)
        assert refused.status_code == 401 and refused.headers["Content-Type"] == "application/json"
        assert TOKEN not in refused.text
        allowed = requests.post(url(gateway, "repeat_int32", route, "locked"), json=body, timeout=10,
                                headers={"Authorization": f"Bearer {TOKEN}"})
        assert allowed.status_code == 200, allowed.text
        answer = allowed.json() if route == "generate" else events(allowed.content)[0]
        assert (answer["OUT"], answer["IDX"]) == (3, 0)


# --- through an MLServer upstream ----------------------------------------------------


def test_generate_through_mlserver(gateway: GatewayProcess, mlserver: MLServerPeer) -> None:
    reply = requests.post(url(gateway, "mls_simple", "generate"), json={"INPUT0": ROW, "INPUT1": ONES}, timeout=30)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["OUTPUT0"] == [v + 1 for v in ROW] and answer["OUTPUT1"] == [v - 1 for v in ROW]
    assert answer["model_name"] == "mls_simple"  # the name the client asked for
    # trig_fp32: x [-1, 2], y [-1, 1]; the same point as a V2 infer gives the same outputs.
    point = {"x": [0.5, 1.0], "y": 2.0, "tag": "generate"}
    infer = requests.post(url(gateway, "mls_trig", "infer"), json={"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 1.0]},
        {"name": "y", "datatype": "FP32", "shape": [1, 1], "data": [2.0]}]}, timeout=30).json()
    expected = {o["name"]: o["data"] for o in infer["outputs"]}
    with requests.post(url(gateway, "mls_trig", "generate_stream"), json=point, timeout=30) as stream:
        assert stream.status_code == 200 and stream.headers["Content-Type"] == SSE_TYPE
        (event,) = events(stream.content)
    assert event["f"] == pytest.approx(expected["f"]) and event["g"] == pytest.approx(expected["g"][0])
    last = mlserver.calls("trig_fp32")[-1]
    assert last["inputs"] == [["x", "FP32", [1, 2]], ["y", "FP32", [1, 1]]]
    assert last["parameters"].get("tag") == "generate"  # a field that names no input: a parameter
