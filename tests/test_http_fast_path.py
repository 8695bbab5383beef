"""The fast HTTP/1.1 path (gateway/transport/http_server/fast.py) over real sockets: which
requests it serves and which it hands to the aiohttp app on the same port,
pipelining across that hand-over, keep-alive, `Expect`, HEAD, chunked
bodies, a slow reader, and the same answers as the aiohttp path gives.

Which server answered is visible on the wire: aiohttp sends a ``Server``
header, the fast path sends none. The listener ``classic`` has the fast
path off (``fast_path: false``), so both paths answer one request side by
side.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from peers.hung_upstream import HungHttpServer
from support import GatewayProcess, wait_for, write_config

CONFIG = """
admin: {{address: "127.0.0.1:0"}}
limits:
  max_request_bytes: 64MiB
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: classic, protocol: v2-rest, address: "127.0.0.1:0", fast_path: false}}
  - {{name: probe, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: umbridge, protocol: umbridge, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin}}
  - {{name: slow, protocol: v2-rest, endpoints: ["{slow}"], binary: always, timeout: {timeout}s}}
routes:
  - match: {{model: slow}}
    upstream: slow
  - match: {{model: "*"}}
    upstream: local
"""
SLOW_TIMEOUT = 1.5  # the slow upstream's route times out after this

IDENTITY = "/v2/models/identity/infer"
BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}).encode()
LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture(scope="module")
def slow() -> Iterator[HungHttpServer]:
    server = HungHttpServer().start()  # accepts, reads, never answers
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gateway(slow: HungHttpServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("fast")
    config = CONFIG.format(slow=slow.address, timeout=SLOW_TIMEOUT)
    gw = GatewayProcess(write_config(directory, config), directory / "gateway.log")
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


def connect(port: int, timeout: float = 10) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


class Reader:
    """Reads responses one after another from one socket (by Content-Length)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.data = b""

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError(f"closed after {self.data[:200]!r}")
        self.data += chunk

    def response(self, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.data:
            self._fill()
        head, _, self.data = self.data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = 0 if head_only else int(headers.get("content-length", "0"))
        while len(self.data) < length:
            self._fill()
        body, self.data = self.data[:length], self.data[length:]
        return int(lines[0].split()[1]), headers, body


def infer(body: bytes = BODY, path: str = IDENTITY, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def outputs(body: bytes) -> list[float]:
    return json.loads(body)["outputs"][0]["data"]


def fast(headers: dict[str, str]) -> bool:
    return "server" not in headers


def test_inference_is_served_by_the_fast_path_and_answers_as_aiohttp_does(gateway: GatewayProcess) -> None:
    answers = {}
    for listener in ("rest", "classic"):
        with connect(gateway.ports[listener]) as sock:
            sock.sendall(infer(extra="X-Request-Id: same-id\r\n"))
            status, headers, body = Reader(sock).response()
        answers[listener] = (status, headers, body)
    assert fast(answers["rest"][1]) and not fast(answers["classic"][1])
    for _, (status, headers, body) in answers.items():
        assert status == 200 and headers["x-request-id"] == "same-id"
        assert headers["content-type"] == "application/json"
        assert outputs(body) == [1, 2]
    assert answers["rest"][2] == answers["classic"][2]
    # Errors too: the same V2 error body and status.
    bad = infer(b'{"inputs": [{"name": "INPUT0"}]}')
    errors = []
    for listener in ("rest", "classic"):
        with connect(gateway.ports[listener]) as sock:
            sock.sendall(bad)
            errors.append(Reader(sock).response())
    assert errors[0][0] == errors[1][0] == 400
    assert errors[0][2] == errors[1][2] and b"error" in errors[0][2]


def test_keep_alive_serves_many_requests_on_one_connection(gateway: GatewayProcess) -> None:
    with connect(gateway.ports["rest"]) as sock:
        reader = Reader(sock)
        for i in range(50):
            body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [i]}]})
            sock.sendall(infer(body.encode()))
            status, headers, answer = reader.response()
            assert status == 200 and fast(headers) and outputs(answer) == [i]


def test_pipelined_requests_are_answered_in_order_across_the_hand_over(gateway: GatewayProcess) -> None:
    """Fast, fast, one the fast path hands over (a Triton extension served
    by aiohttp), then fast ones again: all answered, in order, on one
    connection that aiohttp serves from the hand-over on."""
    bodies = [json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [i]}]}).encode()
              for i in range(5)]
    index = b'POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}'
    pipeline = infer(bodies[0]) + infer(bodies[1]) + index + infer(bodies[2]) + LIVE + infer(bodies[3])
    with connect(gateway.ports["rest"]) as sock:
        sock.sendall(pipeline)
        reader = Reader(sock)
        first, second, listed, third, live, fourth = (reader.response() for _ in range(6))
    assert [outputs(r[2]) for r in (first, second, third, fourth)] == [[0], [1], [2], [3]]
    assert fast(first[1]) and fast(second[1])
    assert listed[0] == 200 and not fast(listed[1]) and isinstance(json.loads(listed[2]), list)
    assert not fast(third[1]) and live[0] == 200  # the connection stays with aiohttp


def test_a_pipeline_split_at_any_byte_is_read_whole(gateway: GatewayProcess) -> None:
    """Heads and bodies arriving a few bytes at a time, split anywhere."""
    pipeline = infer() + infer() + LIVE
    with connect(gateway.ports["rest"]) as sock:
        for start in range(0, len(pipeline), 7):
            sock.sendall(pipeline[start:start + 7])
            time.sleep(0.001)
        reader = Reader(sock)
        answers = [reader.response() for _ in range(3)]
    assert [a[0] for a in answers] == [200, 200, 200]
    assert outputs(answers[0][2]) == outputs(answers[1][2]) == [1, 2]


def test_a_chunked_body_goes_to_aiohttp_and_is_served(gateway: GatewayProcess) -> None:
    chunked = (f"POST {IDENTITY} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               f"{len(BODY[:10]):x}\r\n").encode() + BODY[:10] + f"\r\n{len(BODY[10:]):x}\r\n".encode() \
        + BODY[10:] + b"\r\n0\r\n\r\n"
    with connect(gateway.ports["rest"]) as sock:
        sock.sendall(infer() + chunked)
        reader = Reader(sock)
        first, second = reader.response(), reader.response()
    assert fast(first[1]) and not fast(second[1])
    assert outputs(first[2]) == outputs(second[2]) == [1, 2]


def test_head_and_http_1_0_go_to_aiohttp(gateway: GatewayProcess) -> None:
    with connect(gateway.ports["rest"]) as sock:
        sock.sendall(b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = Reader(sock).response(head_only=True)
    assert status == 200 and not fast(headers)
    with connect(gateway.ports["rest"]) as sock:
        sock.sendall(infer().replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        status, headers, body = Reader(sock).response()
    assert status == 200 and not fast(headers) and outputs(body) == [1, 2]


def test_expect_continue_on_the_fast_path(gateway: GatewayProcess) -> None:
    """`100 Continue` only once the handler reads the body: an unknown model
    is refused (404) without it, and that connection closes."""
    with connect(gateway.ports["rest"]) as sock:
        head = infer(extra="Expect: 100-continue\r\n")[:-len(BODY)]
        sock.sendall(head)
        reader = Reader(sock)
        status, _, _ = reader.response()
        assert status == 100
        sock.sendall(BODY)
        status, headers, body = reader.response()
        assert status == 200 and fast(headers) and outputs(body) == [1, 2]
    with connect(gateway.ports["rest"]) as sock:
        sock.sendall(infer(path="/v2/models/no-such-model/infer", extra="Expect: 100-continue\r\n")[:-len(BODY)])
        status, headers, body = Reader(sock).response()
        assert status == 404 and b"no-such-model" in body
        assert headers.get("connection") == "close"
        assert sock.recv(1) == b""


def test_a_malformed_head_gets_the_protocols_error_and_quotes_nothing(gateway: GatewayProcess) -> None:
    secret = "tok-9f8e7d"
    with connect(gateway.ports["rest"]) as sock:
        sock.sendall(f"POST {IDENTITY} HTTP/1.1\r\nHost: x\r\nBad Header{secret}: 1\r\n\r\n".encode())
        status, _, body = Reader(sock).response()
    assert status == 400 and secret not in body.decode() and "error" in json.loads(body)
    with connect(gateway.ports["rest"]) as sock:
        sock.sendall(f"POST {IDENTITY} HTTP/1.1\r\nHost: x\r\nX-Long: {'a' * 20000}\r\n\r\n".encode())
        status, _, body = Reader(sock).response()
    assert status == 431 and "error" in json.loads(body)


def test_umbridge_evaluate_is_served_by_the_fast_path(gateway: GatewayProcess) -> None:
    call = json.dumps({"name": "forward", "input": [[0.1, 0.2], [0.3]]}).encode()
    with connect(gateway.ports["umbridge"]) as sock:
        sock.sendall(infer(call, path="/Evaluate"))
        status, headers, body = Reader(sock).response()
    assert fast(headers), headers
    # the builtin forward model: scale * [x0 + x1, x0 * y0, x1 ** 2]
    assert status == 200 and json.loads(body) == {"output": [pytest.approx([0.1 + 0.2, 0.1 * 0.3, 0.2 ** 2])]}


def test_a_slow_reader_of_a_big_answer_stalls_nobody(gateway: GatewayProcess) -> None:
    """An 8 MiB answer the client does not read for a while: probes on
    other connections are answered at once meanwhile, and the answer
    arrives whole once the client reads."""
    size = 8 << 20
    head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [size // 4],
                                   "parameters": {"binary_data_size": size}}],
                       "parameters": {"binary_data_output": True}}).encode()
    payload = bytes(range(256)) * (size // 256)
    request = (f"POST {IDENTITY} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(head) + size}\r\n"
               f"Inference-Header-Content-Length: {len(head)}\r\n\r\n").encode() + head + payload
    slow = connect(gateway.ports["rest"])
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    try:
        sender = threading.Thread(target=slow.sendall, args=(request,))
        sender.start()
        worst = 0.0
        with connect(gateway.ports["probe"]) as probe:
            reader = Reader(probe)
            for _ in range(20):
                started = time.monotonic()
                probe.sendall(LIVE)
                assert reader.response()[0] == 200
                worst = max(worst, time.monotonic() - started)
                time.sleep(0.05)
        sender.join(30)
        status, headers, body = Reader(slow).response()
    finally:
        slow.close()
    assert status == 200 and fast(headers)
    assert int(headers["inference-header-content-length"]) + size == len(body)
    assert body.endswith(payload[-4096:])
    assert worst < 0.5, f"a probe took {worst * 1000:.0f} ms while a client read slowly"


def test_the_access_log_and_metrics_count_fast_requests(gateway: GatewayProcess) -> None:
    request_id = f"fast-log-{time.monotonic_ns()}"
    with connect(gateway.ports["rest"]) as sock:
        sock.sendall(infer(extra=f"X-Request-Id: {request_id}\r\n"))
        assert Reader(sock).response()[0] == 200
    line = wait_for(lambda: [line for line in gateway.log().splitlines() if f"request_id={request_id}" in line],
                    5, "the access-log line")[0]
    for field in ("listener=rest", "operation=infer", "model=identity", "status=200", "outcome=ok",
                  f"request_bytes={len(BODY)}", "method=POST", f"path={IDENTITY}"):
        assert field in line, (field, line)


def test_a_slow_upstream_holds_only_its_own_connection(gateway: GatewayProcess) -> None:
    """A request to an upstream that never answers, with a fast one
    pipelined behind it: other connections are served at once meanwhile;
    the slow one gets its 504 at the route's timeout, then the pipelined
    one its answer, in order."""
    with connect(gateway.ports["rest"]) as held, connect(gateway.ports["rest"]) as other:
        started = time.monotonic()
        held.sendall(infer(path="/v2/models/slow/infer") + infer())
        time.sleep(0.1)
        reader = Reader(other)
        for _ in range(5):
            other.sendall(infer())
            status, _, body = reader.response()
            assert status == 200 and outputs(body) == [1, 2]
        assert not select.select([held], [], [], 0)[0], "the other connection waited for the slow one"
        held_reader = Reader(held)
        status, headers, body = held_reader.response()
        waited = time.monotonic() - started
        assert status == 504 and fast(headers) and b"slow" in body, body
        assert SLOW_TIMEOUT - 0.1 < waited < SLOW_TIMEOUT + 3
        status, _, body = held_reader.response()
        assert status == 200 and outputs(body) == [1, 2]


def test_a_client_that_never_reads_its_answers_stops_being_served(gateway: GatewayProcess) -> None:
    """Pipelined requests from a client that reads nothing: once its answers
    fill the socket buffers, the gateway writes no more of them and stops
    reading its requests (memory stays bounded), and serves others meanwhile."""
    count = 60_000
    request = b"GET /v2/models/simple HTTP/1.1\r\nHost: x\r\n\r\n"
    answered = lambda: gateway.log().count("path=/v2/models/simple operation=model_metadata")  # noqa: E731
    before = answered()
    greedy = socket.socket()
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    greedy.connect(("127.0.0.1", gateway.ports["rest"]))
    greedy.settimeout(30)
    sender = threading.Thread(target=lambda: _send_quietly(greedy, request * count), daemon=True)
    sender.start()
    try:
        time.sleep(3)
        stalled_at = answered()
        time.sleep(1)
        assert answered() - stalled_at < 50, "the gateway kept answering a client that reads nothing"
        assert stalled_at - before < count // 2
        with connect(gateway.ports["probe"]) as probe:  # answered meanwhile (bounded by its socket timeout)
            probe.sendall(LIVE)
            assert Reader(probe).response()[0] == 200
    finally:
        greedy.close()
        sender.join(10)


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass  # closed by the test


async def test_a_handler_answer_that_is_not_bytes_is_a_500_not_a_hung_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler's bug (a body part that is not bytes-like) must still
    answer: the protocol's 500, and the connection goes on serving."""
    import asyncio

    from gateway.protocols.v2_rest.frontend import V2RestFrontend
    from gateway.transport.http_server.exchange import HttpReply
    from support import BUILTIN_REST_CONFIG, InProcessGateway

    async def broken(self: V2RestFrontend, request: object) -> HttpReply:
        return HttpReply(200, [object()])

    monkeypatch.setattr(V2RestFrontend, "live", broken)
    async with InProcessGateway(BUILTIN_REST_CONFIG) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.gateway.ports["rest"])
        try:
            writer.write(LIVE + b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert first.startswith(b"HTTP/1.1 500"), first
            length = int(first.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            assert b"internal error" in await asyncio.wait_for(reader.readexactly(length), 5)
            second = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert second.startswith(b"HTTP/1.1 200"), second
        finally:
            writer.close()
