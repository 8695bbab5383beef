"""The fast HTTP path's keep-alive idle timeout: one timer per connection
checks how long it has been idle, so a connection answering requests is
never closed by a timer set in an earlier idle spell, and an idle one is
closed once ``limits.idle_timeout`` has passed since its last answer."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator

import pytest

from support import BUILTIN_REST_CONFIG, GatewayProcess, write_config

IDLE = 1.0  # limits.idle_timeout, seconds

CONFIG = BUILTIN_REST_CONFIG + f"limits: {{idle_timeout: {IDLE}s}}\n"

BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}).encode()
INFER = (b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         b"Content-Length: %d\r\n\r\n" % len(BODY)) + BODY


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("idle")
    with GatewayProcess(write_config(directory, CONFIG), directory / "gateway.log") as gw:
        yield gw


def answer(sock: socket.socket) -> tuple[int, dict[str, str]]:
    """One whole answer (by its Content-Length); its status and headers."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the gateway closed the connection instead of answering"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "the gateway closed the connection in the middle of an answer"
        body += chunk
    return int(lines[0].split()[1]), headers


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the gateway closes ``sock`` within ``seconds`` (nothing else may come)."""
    readable, _, _ = select.select([sock], [], [], seconds)
    if not readable:
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_connection_in_use_outlives_idle_timeout_and_closes_once_idle(gateway: GatewayProcess) -> None:
    with socket.create_connection(("127.0.0.1", gateway.ports["rest"]), timeout=10) as sock:
        sock.sendall(INFER)
        status, headers = answer(sock)
        assert status == 200 and "server" not in headers  # the fast path answered
        # Requests 0.6 idle_timeout apart for three idle_timeouts: the timer set
        # after the first answer fires between two of them and must let the
        # connection be.
        started = time.monotonic()
        while time.monotonic() - started < 3 * IDLE:
            assert not closed_within(sock, 0.6 * IDLE), "closed while in use"
            sock.sendall(INFER)
            assert answer(sock)[0] == 200
        last_answer = time.monotonic()
        assert closed_within(sock, IDLE + 5), "never closed while idle"
        assert time.monotonic() - last_answer >= 0.9 * IDLE
