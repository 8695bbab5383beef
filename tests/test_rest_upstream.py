"""The v2-rest upstream's choice of binary or JSON tensors.

`binary: auto` learns it from the server's metadata (checked against a
second copy of this gateway, which lists `binary_tensor_data` as Triton
does: no Triton server runs here; MLServer, which lists no extensions, is
covered in test_grpc_bridging.py) or, when the metadata cannot be read, from
a rejected binary attempt. No real server here hides its metadata, so that
case uses a small stand-in that behaves like MLServer on infer (422 for
binary) and 404s `GET /v2`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from support import GatewayProcess, wait_for, write_config


class _NoMetadataServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[tuple[str, str]] = []  # (model, "binary" | "json")


class _Handler(BaseHTTPRequestHandler):
    server: _NoMetadataServer

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._reply(404, {"error": "no such route"})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        model = self.path.split("/")[3]
        if "Inference-Header-Content-Length" in self.headers:
            self.server.seen.append((model, "binary"))
            self._reply(422, {"error": "binary tensors are not supported"})
            return
        self.server.seen.append((model, "json"))
        request = json.loads(body)
        outputs = [{**item, "name": "OUTPUT0"} for item in request["inputs"][:1]]
        self._reply(200, {"model_name": model, "outputs": outputs})


@pytest.fixture(scope="module")
def stand_in() -> Iterator[_NoMetadataServer]:
    server = _NoMetadataServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def gateway(stand_in: _NoMetadataServer, builtin_gateway: GatewayProcess,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    address = f"127.0.0.1:{stand_in.server_address[1]}"
    config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: auto, protocol: v2-rest, endpoints: ["{address}"]}}
  - {{name: never, protocol: v2-rest, endpoints: ["{address}"], binary: never}}
  - {{name: always, protocol: v2-rest, endpoints: ["{address}"], binary: always}}
  - {{name: gateway-b, protocol: v2-rest, endpoints: ["{builtin_gateway.url('rest')}"]}}
routes:
  - {{match: {{model: auto}}, upstream: auto}}
  - {{match: {{model: never}}, upstream: never}}
  - {{match: {{model: always}}, upstream: always}}
  - {{match: {{model: "*"}}, upstream: gateway-b}}
"""
    directory = tmp_path_factory.mktemp("rest-upstream")
    with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
        yield gw


def _infer(gateway: GatewayProcess, model: str, array: np.ndarray, datatype: str) -> np.ndarray:
    with httpclient.InferenceServerClient(gateway.url("rest")) as client:
        item = httpclient.InferInput("INPUT0", list(array.shape), datatype)
        item.set_data_from_numpy(array)  # binary, tritonclient's default
        return client.infer(model, [item]).as_numpy("OUTPUT0")  # type: ignore[no-any-return]


def test_auto_learns_json_from_a_rejected_binary_attempt(gateway: GatewayProcess,
                                                          stand_in: _NoMetadataServer) -> None:
    a = np.arange(6, dtype=np.int32)
    for _ in range(2):
        np.testing.assert_array_equal(_infer(gateway, "auto", a, "INT32"), a)
    assert [mode for model, mode in stand_in.seen if model == "auto"] == ["binary", "json", "json"]
    # The request sent twice is said so in the log, with its id.
    wait_for(lambda: "answered binary tensors with 422; sending it again as JSON" in gateway.log(), 5,
             "the second send logged")


def test_never_sends_json(gateway: GatewayProcess, stand_in: _NoMetadataServer) -> None:
    a = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(_infer(gateway, "never", a, "FP32"), a)
    assert [mode for model, mode in stand_in.seen if model == "never"] == ["json"]


def test_always_sends_binary_and_reports_the_refusal(gateway: GatewayProcess) -> None:
    with pytest.raises(InferenceServerException) as info:
        _infer(gateway, "always", np.arange(3, dtype=np.float32), "FP32")
    assert info.value.status() == "400"
    assert "answered 422: binary tensors are not supported" in info.value.message()


def test_auto_uses_binary_when_metadata_lists_it(gateway: GatewayProcess) -> None:
    """Gateway to gateway (the upstream is a second copy of this gateway,
    standing in for Triton): non-UTF-8 BYTES cannot travel as JSON, so this
    answer proves the hop used binary tensors, as the metadata advertised."""
    raw = np.array([b"\xff\x00\xfe", b"ok"], dtype=np.object_)
    assert list(_infer(gateway, "identity", raw, "BYTES")) == list(raw)
    # (the log is written by its own thread: the line may land just after the answer)
    wait_for(lambda: "binary tensor extension listed, sending binary" in gateway.log(), 5, "the binary decision logged")
