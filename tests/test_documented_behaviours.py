"""Behaviours the documentation promises (docs/routing-and-resilience.md,
docs/security.md), each checked against a real gateway process: the
remote-reload guard, `Connection: close` while draining on both HTTP servers,
SIGINT draining without the delay, an ejection that runs its full time while
health checks pass, and a busy mirror dropping its copy. Upstreams are the
V2 stand-ins (tests/peers/echo_upstream.py) behind the gateway's own v2-rest
upstream client: separate processes that can be told to fail or slow down."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from netns import OTHER_ADDRESS, private_network

from peers.echo_gateway import upstream_state
from peers.echo_upstream import EchoServer
from peers.load import PAYLOAD
from support import BUILTIN_REST_CONFIG, SIMPLE_INFER_REQUEST, GatewayProcess, wait_for, write_config

TIMEOUT = 10.0  # bound on every client call


def _post(port: int, path: str, body: dict[str, Any], host: str = "127.0.0.1") -> tuple[int, Any]:
    request = urllib.request.Request(f"http://{host}:{port}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=TIMEOUT) as reply:
            reply.read()
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return error.code


def _echo_infer(gw: GatewayProcess, model: str, payload: dict[str, Any] = PAYLOAD) -> tuple[int, str]:
    """(status, the echo server that answered)."""
    status, body = _post(gw.ports["rest"], f"/v2/models/{model}/infer", payload)
    servers = [o["data"][0] for o in body.get("outputs", []) if o["name"] == "SERVER"]
    return status, servers[0] if servers else ""


ECHO_LISTENER = """
admin: {address: "127.0.0.1:0"}
listeners: [{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}]
"""


@pytest.fixture
def echoes(tmp_path: Path) -> Iterator[dict[str, EchoServer]]:
    with EchoServer.running({"A": EchoServer("A", tmp_path), "B": EchoServer("B", tmp_path)}) as servers:
        yield servers


# --- the remote-reload guard -------------------------------------------------------


_RELOAD_CLIENT = """
import http.client, json, sys
host, port, source, token = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
connection = http.client.HTTPConnection(host, port, timeout=10, source_address=(source, 0))
connection.request("POST", "/reload", body=b"", headers={"Authorization": f"Bearer {token}"} if token else {})
reply = connection.getresponse()
print(json.dumps([reply.status, json.loads(reply.read())]))
"""


def _admin_reload(prefix: list[str], port: int, source: str, token: str | None) -> tuple[int, Any]:
    """POST /reload to the admin listener, from ``source``, inside the namespace."""
    host = OTHER_ADDRESS if source == OTHER_ADDRESS else "127.0.0.1"
    done = subprocess.run([*prefix, sys.executable, "-c", _RELOAD_CLIENT, host, str(port), source, token or ""],
                          capture_output=True, text=True, timeout=TIMEOUT + 5, check=True)
    status, body = json.loads(done.stdout)
    return status, body


@pytest.mark.parametrize("allow_remote", [False, True])
def test_reload_from_a_non_loopback_client_is_refused_unless_allowed(tmp_path: Path, allow_remote: bool) -> None:
    """In a private network namespace whose loopback also carries an address
    outside 127/8, the admin listens on 0.0.0.0 with a token: a client from
    that address passes the token check and reaches the reload handler's own
    test of the client's address."""
    token = "t0ken-for-the-test"
    config = BUILTIN_REST_CONFIG.replace(
        'admin: {address: "127.0.0.1:0"}',
        f'admin: {{address: "0.0.0.0:0", token: {{env: GW_TEST_ADMIN_TOKEN}}, allow_remote_reload: '
        f'{str(allow_remote).lower()}}}')
    with private_network() as prefix, GatewayProcess(write_config(tmp_path, config), tmp_path / "gateway.log",
                                                     extra_env={"GW_TEST_ADMIN_TOKEN": token}, prefix=prefix) as gw:
        admin = gw.ports["admin"]
        assert _admin_reload(prefix, admin, OTHER_ADDRESS, None)[0] == 401  # the token is checked first
        status, body = _admin_reload(prefix, admin, OTHER_ADDRESS, token)
        if allow_remote:
            assert (status, body["reloaded"]) == (200, True), body
        else:
            assert status == 403, body
            assert body["error"] == "reload is only allowed from loopback (admin.allow_remote_reload)"
            assert OTHER_ADDRESS not in json.dumps(body)
        status, body = _admin_reload(prefix, admin, "127.0.0.1", token)  # loopback: always allowed
        assert (status, body["reloaded"]) == (200, True), body
    reloads = [line for line in gw.log().splitlines() if "configuration reloaded from" in line]
    assert len(reloads) == (2 if allow_remote else 1), gw.log()


# --- drain ---------------------------------------------------------------------------

INFER_BODY = json.dumps(SIMPLE_INFER_REQUEST).encode()


def _send_infer(sock: socket.socket, chunked: bool) -> None:
    """One infer request of the builtin `simple` model: with Content-Length the
    fast path serves it; chunked, the fast path hands the connection to aiohttp."""
    head = "POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if chunked:
        sock.sendall(f"{head}Transfer-Encoding: chunked\r\n\r\n{len(INFER_BODY):x}\r\n".encode()
                     + INFER_BODY + b"\r\n0\r\n\r\n")
    else:
        sock.sendall(f"{head}Content-Length: {len(INFER_BODY)}\r\n\r\n".encode() + INFER_BODY)


def _read_reply(sock: socket.socket) -> tuple[int, dict[str, str]]:
    """Status and headers (lower-case names) of one answer with a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed within the body"
        rest += chunk
    assert len(rest) == length, "more than one answer"
    return int(lines[0].split()[1]), headers


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""  # bounded by the socket's timeout
    except ConnectionResetError:
        return True


def test_responses_during_the_drain_delay_say_connection_close_on_both_servers(tmp_path: Path) -> None:
    config = BUILTIN_REST_CONFIG + "drain: {delay: 10s, timeout: 5s}\n"
    gw = GatewayProcess(write_config(tmp_path, config), tmp_path / "gateway.log").start()
    try:
        port, admin = gw.ports["rest"], gw.ports["admin"]
        kept = {way: socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) for way in ("fast", "aiohttp")}
        for way, sock in kept.items():  # before the drain: kept alive
            _send_infer(sock, chunked=way == "aiohttp")
            status, headers = _read_reply(sock)
            assert status == 200 and headers.get("connection", "").lower() != "close", (way, headers)
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: _get(admin, "/readyz") == 503, TIMEOUT, "readiness to turn false")
        fresh = {way: socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) for way in ("fast", "aiohttp")}
        for connections in (kept, fresh):  # old keep-alive connections and new ones alike
            for way, sock in connections.items():
                _send_infer(sock, chunked=way == "aiohttp")
                status, headers = _read_reply(sock)
                assert status == 200 and headers.get("connection", "").lower() == "close", (way, headers)
                assert _closed_by_server(sock), way
                sock.close()
        assert gw.proc.wait(30) == 0  # the delay ends, the listeners close, the process exits
    finally:
        gw.stop()


def test_sigint_drains_without_the_delay(tmp_path: Path, echoes: dict[str, EchoServer]) -> None:
    """drain.delay is a minute: SIGINT must not wait for it, yet the request
    in flight is still answered."""
    config = ECHO_LISTENER + f"""upstreams: [{{name: a, protocol: v2-rest, endpoints: ["{echoes["A"].address}"]}}]
routes: [{{match: {{model: "*"}}, upstream: a}}]
drain: {{delay: 60s, timeout: 10s}}
"""
    gw = GatewayProcess(write_config(tmp_path, config), tmp_path / "gateway.log").start()
    try:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(_echo_infer, gw, "m", {**PAYLOAD, "parameters": {"delay_ms": 1500}})
            wait_for(lambda: echoes["A"].stats()["infer"] == 1, TIMEOUT, "the request to reach the upstream")
            assert gw.proc is not None
            gw.proc.send_signal(signal.SIGINT)
            try:
                code = gw.proc.wait(30)  # well inside the minute of delay SIGTERM would take
            except subprocess.TimeoutExpired:
                pytest.fail("SIGINT waited for drain.delay")
            assert code == 0
            assert answer.result(TIMEOUT) == (200, "A")  # drained: the request in flight finished
    finally:
        gw.stop()
    assert "serving new requests for 0s more" in gw.log()


# --- outlier ejection ----------------------------------------------------------------


def test_an_ejection_runs_its_full_time_while_health_checks_pass(tmp_path: Path,
                                                                 echoes: dict[str, EchoServer]) -> None:
    a, b = echoes["A"], echoes["B"]
    config = ECHO_LISTENER + f"""upstreams:
  - name: pair
    protocol: v2-rest
    endpoints: ["{a.address}", "{b.address}"]
    health_check: {{interval: 100ms, timeout: 1s, unhealthy_threshold: 1, healthy_threshold: 1}}
    outlier_detection: {{consecutive_failures: 1, base_ejection_time: 8s}}
routes: [{{match: {{model: "*"}}, upstream: pair}}]
"""
    with GatewayProcess(write_config(tmp_path, config), tmp_path / "gateway.log") as gw:
        b.control(status=503)  # B fails requests, yet answers its readiness probe
        for _ in range(20):
            _echo_infer(gw, "m")
            if upstream_state(gw, "pair")["endpoints"][1]["ejected"]:
                break
        else:
            pytest.fail("B was never ejected")
        b.control(status=200)  # B would serve again; its ejection must still run out
        probes, served = b.stats()["server_ready"], b.stats()["infer"]
        wait_for(lambda: b.stats()["server_ready"] >= probes + 5, TIMEOUT, "five passing health checks of B")
        answers = [_echo_infer(gw, "m") for _ in range(6)]
        state = upstream_state(gw, "pair")["endpoints"][1]
        assert state["healthy"] and state["ejected"], state
        assert answers == [(200, "A")] * 6 and b.stats()["infer"] == served
        wait_for(lambda: not upstream_state(gw, "pair")["endpoints"][1]["ejected"], 30, "B to be readmitted")
        assert (200, "B") in [_echo_infer(gw, "m") for _ in range(4)]  # round robin reaches B again


# --- mirrors -------------------------------------------------------------------------


@pytest.fixture
def with_shadow(tmp_path: Path) -> Iterator[dict[str, EchoServer]]:
    servers = {"A": EchoServer("A", tmp_path), "SHADOW": EchoServer("SHADOW", tmp_path, delay=10.0)}
    with EchoServer.running(servers):  # each copy holds the shadow 10 s
        yield servers


def test_a_busy_mirror_drops_its_copy_and_metadata_is_never_mirrored(tmp_path: Path,
                                                                    with_shadow: dict[str, EchoServer]) -> None:
    a, shadow = with_shadow["A"], with_shadow["SHADOW"]
    config = ECHO_LISTENER + f"""upstreams:
  - {{name: main, protocol: v2-rest, endpoints: ["{a.address}"]}}
  - name: shadow
    protocol: v2-rest
    endpoints: ["{shadow.address}"]
    timeout: 20s
    circuit_breaker: {{max_requests: 1, max_pending: 8}}  # requests could wait in line: copies must not
routes: [{{match: {{model: "*"}}, upstream: main, mirror: [{{upstream: shadow}}]}}]
"""
    with GatewayProcess(write_config(tmp_path, config), tmp_path / "gateway.log") as gw:
        port = gw.ports["rest"]
        assert _get(port, "/v2/models/m") == 200 and _get(port, "/v2/models/m/ready") == 200
        assert a.stats()["metadata"] == 1 and a.stats()["model_ready"] == 1
        counters = upstream_state(gw, "shadow")["counters"]  # a copy is counted before the answer goes out
        assert (counters["mirrored_total"], counters["mirror_dropped_total"]) == (0, 0), counters

        assert _echo_infer(gw, "m") == (200, "A")
        wait_for(lambda: shadow.stats()["infer"] == 1, TIMEOUT, "the copy to hold the shadow's one slot")
        answers = [_echo_infer(gw, "m") for _ in range(5)]  # the shadow is busy for 10 s
        assert answers == [(200, "A")] * 5
        counters = upstream_state(gw, "shadow")["counters"]
        assert (counters["mirrored_total"], counters["mirror_dropped_total"]) == (1, 5), counters
        stats = shadow.stats()
        assert (stats["infer"], stats["max_in_flight"], stats["metadata"], stats["model_ready"]) == (1, 1, 0, 0)
