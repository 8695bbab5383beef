"""Connections and HTTP-level refusals: idle keep-alive
connections make room for new ones, the open-file limit is raised and its
exhaustion logged, `100 Continue` comes after the early refusals, and
malformed-HTTP errors quote nothing the client sent.

Each test drives a gateway process over real loopback sockets.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from security_support import make_pki

from peers.nofile_gateway import nofile_env
from support import REPO, GatewayProcess, metric_value, scrape_metrics, wait_for, write_config

CONNECTIONS = 8  # limits.max_connections
MAX_BODY = 1 << 20  # limits.max_request_bytes
TOKEN = "s3cr3t-token-do-not-echo"
IDENTITY = "/v2/models/identity/infer"
LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"

CONFIG = f"""
admin: {{address: "127.0.0.1:0"}}
limits:
  max_connections: {CONNECTIONS}
  max_request_bytes: {MAX_BODY}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: secured, protocol: v2-rest, address: "127.0.0.1:0", auth: {{token: {{env: GW_TEST_TOKEN}}}}}}
upstreams:
  - {{name: local, protocol: builtin}}
routes:
  - match: {{model: "*"}}
    upstream: local
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("conns")
    # At debug level, so that the test of malformed HTTP sees every line the gateway logs.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GW_TEST_LOG", "debug")
        gw = GatewayProcess(write_config(directory, CONFIG), directory / "gateway.log", {"GW_TEST_TOKEN": TOKEN})
        gw.start()
    try:
        yield gw
    finally:
        gw.stop()


# --- a minimal HTTP/1.1 client over one socket ---------------------------------------


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.settimeout(5)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response (status, headers, body), by its Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed within the body")
        body += chunk
    return int(lines[0].split()[1]), headers, body


def exchange(sock: socket.socket, request: bytes) -> tuple[int, dict[str, str], bytes]:
    sock.sendall(request)
    return read_response(sock)


def closed_by_gateway(sock: socket.socket, wait: float = 5.0) -> bool:
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def infer_request(body: bytes, extra: str = "") -> bytes:
    return (f"POST {IDENTITY} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


INFER_BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}).encode()


def in_flight(gw: GatewayProcess) -> float:
    return metric_value(scrape_metrics(gw), "gateway_requests_in_flight", listener="rest")


# --- connection limits -------------------------------------------------------------------


def test_idle_keepalive_connections_make_room_oldest_first(gateway: GatewayProcess) -> None:
    """At max_connections, a new client is served: the connection idle the
    longest is closed for it, the others keep serving."""
    port = gateway.ports["rest"]
    idle = [connect(port) for _ in range(CONNECTIONS)]
    try:
        for sock in idle:  # in this order: idle[0] is the oldest idle
            assert exchange(sock, LIVE)[0] == 200
        newcomer = connect(port)
        status, _, body = exchange(newcomer, infer_request(INFER_BODY))
        assert status == 200, body
        assert closed_by_gateway(idle[0])
        for sock in idle[1:]:
            assert exchange(sock, LIVE)[0] == 200
        newcomer.close()
    finally:
        for sock in idle:
            sock.close()


def test_busy_connections_refuse_new_ones_and_the_refusal_is_logged(gateway: GatewayProcess) -> None:
    """Only when no connection is idle does a new one get the overloaded
    answer; the refusal is logged."""
    port = gateway.ports["rest"]
    busy = [connect(port) for _ in range(CONNECTIONS)]
    try:
        for sock in busy:  # a request in progress: its body half sent
            sock.sendall(infer_request(INFER_BODY)[:-5])
        wait_for(lambda: in_flight(gateway) == CONNECTIONS, 10, "the requests to be in flight")
        refused = connect(port)
        status, _, body = exchange(refused, infer_request(INFER_BODY))
        assert status == 429 and "limits.max_connections" in json.loads(body)["error"]
        assert closed_by_gateway(refused)
        refused.close()
        wait_for(lambda: "answered overloaded" in gateway.log(), 5, "the refusal in the log")
        for sock in busy:  # the requests in progress were left alone
            sock.sendall(infer_request(INFER_BODY)[-5:])
            assert read_response(sock)[0] == 200
    finally:
        for sock in busy:
            sock.close()


def test_connections_stuck_in_their_tls_handshake_make_room(tmp_path: Path) -> None:
    """A connection that never sends its TLS hello counts against
    max_connections and is closed, the oldest first, to admit a client
    (it used to be counted only after its handshake, for up to a minute)."""
    make_pki(tmp_path)
    plain = '{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}'
    config = CONFIG.replace(plain, plain[:-1] + ", tls: {cert: server.pem, key: server.key}}")
    with GatewayProcess(write_config(tmp_path, config), tmp_path / "gateway.log", {"GW_TEST_TOKEN": TOKEN}) as gw:
        port = gw.ports["rest"]
        silent = [connect(port) for _ in range(CONNECTIONS)]
        try:
            context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
            with context.wrap_socket(connect(port), server_hostname="127.0.0.1") as client:
                assert exchange(client, LIVE)[0] == 200
            assert closed_by_gateway(silent[0])
            assert not closed_by_gateway(silent[1], wait=0.2)
        finally:
            for sock in silent:
                sock.close()


def test_open_file_limit_is_raised_and_its_exhaustion_logged(tmp_path: Path) -> None:
    """The soft RLIMIT_NOFILE is raised to the hard one; when that is
    exhausted too, idle connections make room and the refusals are logged
    once (then counted), where they used to be closed silently."""
    config = write_config(tmp_path, CONFIG.replace(f"max_connections: {CONNECTIONS}", "max_connections: 1024"))
    gw = GatewayProcess(config, tmp_path / "gateway.log", {**nofile_env(64, 160), "GW_TEST_TOKEN": TOKEN},
                        module="peers.nofile_gateway")
    with gw:
        log = wait_for(lambda: "over the open-file limit of 160" in (text := gw.log()) and text, 5, "the warnings")
        assert "raised the open-file limit (RLIMIT_NOFILE) from 64 to 160" in log
        assert "over the open-file limit of 160" in log  # 2 listeners x 1024 connections
        port = gw.ports["rest"]
        clients = []
        try:
            for _ in range(200):  # more than 160 descriptors
                sock = connect(port)
                clients.append(sock)
                assert exchange(sock, LIVE)[0] == 200
            refusals = wait_for(lambda: [line for line in gw.log().splitlines() if "refused or delayed" in line],
                                5, "the first refusal logged")
            assert len(refusals) == 1 and "EMFILE" in refusals[0]  # once: the rest are counted
        finally:
            for sock in clients:
                sock.close()
    summary = [line for line in gw.log().splitlines() if "refused or delayed" in line][1:]
    assert len(summary) == 1 and "more connections" in summary[0]  # the count, logged as the listener stops


def test_check_warns_when_the_open_file_limit_is_too_low(tmp_path: Path) -> None:
    config = write_config(tmp_path, CONFIG)
    env = {**nofile_env(64, 80), "GW_TEST_TOKEN": TOKEN}
    result = subprocess.run([sys.executable, "-m", "peers.nofile_gateway", "check", "--config", str(config)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    # 2 listeners x 8 connections + 64: 80 fits; one more connection each does not.
    assert "warning" not in result.stderr
    write_config(tmp_path, CONFIG.replace(f"max_connections: {CONNECTIONS}", "max_connections: 9"))
    result = subprocess.run([sys.executable, "-m", "peers.nofile_gateway", "check", "--config", str(config)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "warning: the configuration may hold about 82 file descriptors" in result.stderr
    assert "over the open-file limit of 80" in result.stderr


# --- Expect: 100-continue ------------------------------------------------------------


def _expecting(port: int, head: str) -> tuple[bytes, socket.socket]:
    """Send a head with `Expect: 100-continue`; the first bytes answered."""
    sock = connect(port)
    sock.sendall(f"{head}Expect: 100-continue\r\n\r\n".encode())
    return sock.recv(65536), sock


@pytest.mark.parametrize(("listener", "head", "status"), [
    ("rest", f"POST {IDENTITY} HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY + 1}\r\n", 413),
    ("secured", f"POST {IDENTITY} HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n", 401),
    ("rest", "POST /v2/nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n", 404),
])
def test_early_refusals_come_before_100_continue(gateway: GatewayProcess, listener: str, head: str,
                                                 status: int) -> None:
    """Refused from its head, in the protocol's form, without a `100`; the
    body is never asked for, so the connection closes at once."""
    first, sock = _expecting(gateway.ports[listener], head)
    try:
        assert first.startswith(f"HTTP/1.1 {status} ".encode()), first
        assert b"100 Continue" not in first
        headers, _, body = first.partition(b"\r\n\r\n")
        assert b"Connection: close" in headers and json.loads(body)["error"]
        assert closed_by_gateway(sock, wait=2)  # not after aiohttp's lingering read
    finally:
        sock.close()


def test_100_continue_then_the_answer(gateway: GatewayProcess) -> None:
    port = gateway.ports["secured"]
    first, sock = _expecting(port, f"POST {IDENTITY} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                   f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(INFER_BODY)}\r\n")
    try:
        assert first == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(INFER_BODY)
        status, _, body = read_response(sock)
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [1, 2]
    finally:
        sock.close()


def test_an_unknown_expectation_gets_417_in_protocol_form(gateway: GatewayProcess) -> None:
    sock = connect(gateway.ports["rest"])
    try:
        status, headers, body = exchange(sock, f"POST {IDENTITY} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                                               "Expect: something-else\r\n\r\n".encode())
    finally:
        sock.close()
    assert status == 417 and headers["content-type"].startswith("application/json")
    assert "100-continue" in json.loads(body)["error"]


# --- malformed HTTP ------------------------------------------------------------------


@pytest.mark.parametrize("bad_line", [f"Authorization: Bearer {TOKEN}\x00", f"X-{TOKEN}\x01: v"])
def test_malformed_header_errors_quote_nothing_sent(gateway: GatewayProcess, bad_line: str) -> None:
    sock = connect(gateway.ports["rest"])
    try:
        status, _, body = exchange(sock, f"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n{bad_line}\r\n\r\n".encode())
    finally:
        sock.close()
    assert status == 400
    message: Any = json.loads(body)["error"]
    assert message in ("malformed HTTP request: Invalid header value char",
                       "malformed HTTP request: Invalid header token")
    assert TOKEN not in gateway.log()  # nor in the log, at debug level


async def test_the_acceptor_serves_until_closed() -> None:
    """asyncio's Server contract, which aiohttp's sites may use: serve_forever
    accepts until close(), then returns."""
    import asyncio

    from gateway.transport.acceptor import Acceptor, RefusalLog, bind

    class Refuse:  # a gate that closes every connection at once
        admitted = 0

        def admit(self) -> None:
            self.admitted += 1

        def connecting(self, protocol: Any, task: Any) -> None: ...

        def failed(self, protocol: Any) -> None: ...

        def free_idle(self) -> bool:
            return False

    gate = Refuse()
    sockets = await bind("127.0.0.1", 0, reuse_port=False, backlog=8)
    acceptor = Acceptor(sockets, gate, RefusalLog("test"), None, backlog=8)
    serving = asyncio.ensure_future(acceptor.serve_forever())
    port = sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    async with asyncio.timeout(5):
        while not gate.admitted:
            await asyncio.sleep(0.01)
    assert not serving.done()
    acceptor.close()
    async with asyncio.timeout(5):
        await serving
    writer.close()
    assert not acceptor.is_serving()
