"""Upstreams that are down, answer garbage or never answer: every client
gets its protocol's error form, fast, naming the upstream.

No real server misbehaves on demand, so the misbehaving upstreams are tiny
stand-ins in this test process (a closed port, a TCP server writing
nonsense, a gRPC server returning bytes that are not a protobuf reply, a
server that accepts and stays silent). The gateway runs in its own process.
"""

from __future__ import annotations

import socketserver
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from support import GatewayProcess, free_port, write_config


def _http_reply(body: bytes) -> bytes:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close"
    return head.encode() + b"\r\n\r\n" + body


NOT_JSON = _http_reply(b"not json!")
NOT_HTTP = b"\x00\x01\x02 this is not HTTP at all\r\n\r\n"
BAD_SIZES = _http_reply(b'{"outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[4],"data":[1]}]}')


class _StandIn(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, reply: bytes | None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.reply = reply  # None: accept and stay silent
        self.closing = threading.Event()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _Handler(socketserver.BaseRequestHandler):
    server: _StandIn

    def handle(self) -> None:
        if self.server.reply is None:
            self.server.closing.wait(30)
            return
        self.request.settimeout(5)
        try:
            self.request.recv(1 << 16)
            self.request.sendall(self.server.reply)
        except OSError:
            pass


def _garbage_grpc_server() -> tuple[grpc.Server, int]:
    def model_infer(request: bytes, context: Any) -> bytes:
        return b"\xff\xff\xff\xff not a ModelInferResponse"

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(model_infer)  # no (de)serializers: bytes in, bytes out
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    stand_ins = {name: _StandIn(reply) for name, reply in
                 (("not-json", NOT_JSON), ("not-http", NOT_HTTP), ("bad-sizes", BAD_SIZES), ("silent", None))}
    threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
               for s in stand_ins.values()]
    for thread in threads:
        thread.start()
    grpc_server, grpc_port = _garbage_grpc_server()
    closed = f"127.0.0.1:{free_port()}"  # nothing listens there
    config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: down-rest, protocol: v2-rest, endpoints: ["{closed}"]}}
  - {{name: down-grpc, protocol: v2-grpc, endpoints: ["{closed}"]}}
  - {{name: not-json, protocol: v2-rest, endpoints: ["{stand_ins['not-json'].address}"]}}
  - {{name: not-http, protocol: v2-rest, endpoints: ["{stand_ins['not-http'].address}"]}}
  - {{name: bad-sizes, protocol: v2-rest, endpoints: ["{stand_ins['bad-sizes'].address}"]}}
  - {{name: not-protobuf, protocol: v2-grpc, endpoints: ["127.0.0.1:{grpc_port}"]}}
  - {{name: silent-rest, protocol: v2-rest, endpoints: ["{stand_ins['silent'].address}"], binary: always}}
  - {{name: silent-grpc, protocol: v2-grpc, endpoints: ["{stand_ins['silent'].address}"], timeout: 500ms}}
routes:
  - {{match: {{model: silent-rest}}, upstream: silent-rest, timeout: 500ms}}
""" + "".join(f"  - {{match: {{model: {name}}}, upstream: {name}}}\n" for name in (
        "down-rest", "down-grpc", "not-json", "not-http", "bad-sizes", "not-protobuf", "silent-grpc"))
    directory = tmp_path_factory.mktemp("failures")
    try:
        with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
            yield gw
    finally:
        grpc_server.stop(0)
        for server in stand_ins.values():
            server.closing.set()
            server.shutdown()
            server.server_close()


def _rest_error(gateway: GatewayProcess, model: str) -> tuple[str, str, float]:
    item = httpclient.InferInput("INPUT0", [4], "FP32")
    item.set_data_from_numpy(np.ones(4, dtype=np.float32))
    started = time.monotonic()
    with httpclient.InferenceServerClient(gateway.url("rest"), network_timeout=10) as client:
        with pytest.raises(InferenceServerException) as info:
            client.infer(model, [item])
    return str(info.value.status()), info.value.message(), time.monotonic() - started


def _grpc_error(gateway: GatewayProcess, model: str) -> tuple[str, str, float]:
    item = grpcclient.InferInput("INPUT0", [4], "FP32")
    item.set_data_from_numpy(np.ones(4, dtype=np.float32))
    started = time.monotonic()
    with grpcclient.InferenceServerClient(gateway.url("grpc")) as client:
        with pytest.raises(InferenceServerException) as info:
            client.infer(model, [item], client_timeout=10)
    return str(info.value.status()), info.value.message(), time.monotonic() - started


CASES = {
    # model (= upstream name): (REST status, gRPC code, words in the message)
    "down-rest": ("503", "StatusCode.UNAVAILABLE", "cannot connect to upstream"),
    "down-grpc": ("503", "StatusCode.UNAVAILABLE", "cannot connect to upstream"),
    "not-json": ("502", "StatusCode.INTERNAL", "not valid JSON"),
    "not-http": ("502", "StatusCode.INTERNAL", "unreadable HTTP reply"),
    "bad-sizes": ("502", "StatusCode.INTERNAL", "has 1 data elements but shape [4] needs 4"),
    "not-protobuf": ("502", "StatusCode.INTERNAL", "not a valid inference.ModelInferResponse"),
    "silent-rest": ("504", "StatusCode.DEADLINE_EXCEEDED", "did not answer within 0.5s"),
    "silent-grpc": ("504", "StatusCode.DEADLINE_EXCEEDED", ""),
}


@pytest.mark.parametrize("client", ["rest", "grpc"])
@pytest.mark.parametrize("upstream", sorted(CASES))
def test_upstream_failure(gateway: GatewayProcess, upstream: str, client: str) -> None:
    rest_status, grpc_code, words = CASES[upstream]
    status, message, elapsed = (_rest_error if client == "rest" else _grpc_error)(gateway, upstream)
    assert status == (rest_status if client == "rest" else grpc_code), message
    assert upstream in message, message  # the upstream is named
    assert words in message
    assert elapsed < 3.0, f"took {elapsed:.1f}s"


def test_gateway_survives_and_logs_no_traceback(gateway: GatewayProcess) -> None:
    with httpclient.InferenceServerClient(gateway.url("rest")) as client:
        assert client.is_server_ready()
    assert "Traceback" not in gateway.log()
