"""What reaches an upstream, seen by the upstream (``peers/recording_upstream.py``,
its own process): a model name or version ``.`` never becomes a dot segment
of an upstream's path, whichever frontend it came in by; headers a request's
``Connection`` header names are never forwarded (RFC 9110 §7.6.1), from
either HTTP server path, to HTTP and gRPC upstreams alike.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import grpc
import pytest
import requests
from graphstorm_payloads import TARGET_MODEL, movielens
from http_wire import exchange

from gateway.config.node import ConfigError
from gateway.protocols.v2_grpc import messages as pb
from peers.recording_upstream import RecordingUpstream
from support import GatewayProcess, parse_yaml_config, write_config

INFER = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]}
HOP = "x-hop-secret"  # allow-listed, then named in Connection: must stay on the client's hop


def gateway_config(recorder: RecordingUpstream) -> str:
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: classic, protocol: v2-rest, address: "127.0.0.1:0", fast_path: false}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
  - {{name: v1, protocol: v1-rest, address: "127.0.0.1:0"}}
  - {{name: umb, protocol: umbridge, address: "127.0.0.1:0"}}
  - {{name: gs, protocol: graphstorm, address: "127.0.0.1:0"}}
upstreams:
  - {{name: rec-rest, protocol: v2-rest, endpoints: ["{recorder.address('rest')}"], timeout: 10s}}
  - {{name: rec-grpc, protocol: v2-grpc, endpoints: ["{recorder.address('grpc')}"], timeout: 10s}}
routes:
  - match: {{model: via-grpc}}
    upstream: rec-grpc
    forward_headers: ["x-tenant", "{HOP}"]
    forward_authorization: true
  - upstream: rec-rest
    forward_headers: ["x-tenant", "{HOP}"]
    forward_authorization: true
"""


@pytest.fixture(scope="module")
def gateway(recorder: RecordingUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("forwarding")
    with GatewayProcess(write_config(directory, gateway_config(recorder)), directory / "gateway.log") as gw:
        yield gw


def raw_request(port: int, method: str, path: str, headers: list[tuple[str, str]] | None = None,
                body: bytes = b"") -> tuple[int, Any]:
    status, _, answer = exchange(port, method, path, headers or (), body)
    return status, json.loads(answer) if answer else None


def dot_paths(recorder: RecordingUpstream) -> list[str]:
    """Paths the recorder received that hold a dot segment (as sent, or
    once percent-decoded)."""
    paths = [call["path"] for call in recorder.calls()] + recorder.unrouted()
    return [path for path in paths if any(part in (".", "..") for part in unquote(path).split("/"))]


# --- a model name or version "." ------------------------------------------------


@pytest.mark.parametrize("listener", ["rest", "classic"])
@pytest.mark.parametrize("path", ["/v2/models/%2E/infer", "/v2/models/%2e/ready", "/v2/models/m/versions/%2E/infer",
                                  "/v2/models/./infer", "/v2/models/m/versions/./infer"])
def test_v2_rest_dot_names_are_refused(gateway: GatewayProcess, recorder: RecordingUpstream, listener: str,
                                       path: str) -> None:
    body = json.dumps(INFER).encode() if path.endswith("infer") else b""
    status, answer = raw_request(gateway.ports[listener], "POST" if body else "GET", path,
                                 [("Content-Type", "application/json")], body)
    assert status == 400 and "'.' is a relative path segment" in answer["error"], (status, answer)
    assert dot_paths(recorder) == []


@pytest.mark.parametrize(("name", "version"), [(".", ""), ("m", ".")])
def test_v2_grpc_dot_names_are_refused(gateway: GatewayProcess, recorder: RecordingUpstream, name: str,
                                       version: str) -> None:
    request = pb.ModelInferRequest(model_name=name, model_version=version)
    request.inputs.add(name="x", datatype="FP32", shape=[2]).contents.fp32_contents.extend([1.0, 2.0])
    with grpc.insecure_channel(gateway.url("grpc")) as channel:
        call = channel.unary_unary(pb.method_path("ModelInfer"),
                                   request_serializer=pb.ModelInferRequest.SerializeToString,
                                   response_deserializer=pb.ModelInferResponse.FromString)
        with pytest.raises(grpc.RpcError) as error:
            call(request, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'.' is a relative path segment" in (error.value.details() or "")
    assert dot_paths(recorder) == []


@pytest.mark.parametrize("path", ["/v1/models/.:predict", "/v1/models/m/versions/.:predict", "/v1/models/%2E"])
def test_v1_dot_names_are_refused(gateway: GatewayProcess, recorder: RecordingUpstream, path: str) -> None:
    body = json.dumps({"instances": [[1.0, 2.0]]}).encode() if path.endswith(":predict") else b""
    status, answer = raw_request(gateway.ports["v1"], "POST" if body else "GET", path,
                                 [("Content-Type", "application/json")], body)
    assert status == 400 and "'.' is a relative path segment" in answer["error"], (status, answer)
    assert dot_paths(recorder) == []


@pytest.mark.parametrize("call", ["Evaluate", "InputSizes"])
def test_umbridge_dot_names_are_refused(gateway: GatewayProcess, recorder: RecordingUpstream, call: str) -> None:
    reply = requests.post(f"http://{gateway.url('umb')}/{call}", json={"name": ".", "input": [[1.0, 2.0]]},
                          timeout=15)
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["type"] == "InvalidInput", reply.text
    assert "'.' is a relative path segment" in error["message"]
    assert dot_paths(recorder) == []


def test_graphstorm_dot_target_model_is_refused(gateway: GatewayProcess, recorder: RecordingUpstream) -> None:
    reply = requests.post(f"http://{gateway.url('gs')}/invocations", json=movielens(), headers={TARGET_MODEL: "."},
                          timeout=15)
    body = reply.json()
    assert body["status_code"] == 400 and "'.' is a relative path segment" in body["error"], body
    assert dot_paths(recorder) == []


@pytest.mark.parametrize("target", ["model: .", "model: ..", "version: ."])
def test_a_rewrite_to_a_dot_segment_is_a_config_error(target: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_yaml_config(f"""
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams: [{{name: up, protocol: v2-rest, endpoints: ["127.0.0.1:9"]}}]
routes: [{{upstream: up, rewrite: {{{target}}}}}]
""")
    assert "routes[0].rewrite." + target.split(":")[0] in str(error.value)
    assert "relative path segment" in str(error.value)


# --- headers named in Connection ------------------------------------------------


def _hop_headers(marker: str, split: bool) -> list[tuple[str, str]]:
    named = [("Connection", f" {HOP.upper()} , Authorization"), ("Connection", "keep-alive")] if split else \
        [("Connection", f"keep-alive, {HOP.upper()}, Authorization")]
    return [("X-Request-Id", marker), ("X-Tenant", "a"), (HOP, "for-the-gateway-only"),
            ("Authorization", "Bearer client-hop-token"), *named]


@pytest.mark.parametrize("split", [False, True], ids=["one-line", "two-lines"])
@pytest.mark.parametrize("model", ["m", "via-grpc"], ids=["to-rest", "to-grpc"])
@pytest.mark.parametrize("listener", ["rest", "classic"])
def test_headers_named_in_connection_are_not_forwarded(gateway: GatewayProcess, recorder: RecordingUpstream,
                                                        listener: str, model: str, split: bool) -> None:
    marker = f"hop-{listener}-{model}-{split}"
    status, answer = raw_request(gateway.ports[listener], "POST", f"/v2/models/{model}/infer",
                                 [("Content-Type", "application/json"), *_hop_headers(marker, split)],
                                 json.dumps(INFER).encode())
    assert status == 200, answer
    seen = recorder.call_with("x-request-id", marker)["headers"]
    assert seen.get("x-tenant") == "a"  # allow-listed and not named: forwarded
    assert HOP not in seen and "authorization" not in seen, seen


@pytest.mark.parametrize("model", ["m", "via-grpc"], ids=["to-rest", "to-grpc"])
def test_allowlisted_headers_still_go_without_connection_naming_them(gateway: GatewayProcess,
                                                                     recorder: RecordingUpstream, model: str) -> None:
    """The control: the same headers, not named in Connection, are forwarded."""
    marker = f"no-hop-{model}"
    status, answer = raw_request(gateway.ports["rest"], "POST", f"/v2/models/{model}/infer",
                                 [("Content-Type", "application/json"), ("X-Request-Id", marker),
                                  (HOP, "end-to-end"), ("Authorization", "Bearer end-to-end")],
                                 json.dumps(INFER).encode())
    assert status == 200, answer
    seen = recorder.call_with("x-request-id", marker)["headers"]
    assert seen.get(HOP) == "end-to-end" and seen.get("authorization") == "Bearer end-to-end"


@pytest.mark.parametrize("listener", ["rest", "classic"])
def test_connection_close_closes_after_a_request_without_a_body(gateway: GatewayProcess, listener: str) -> None:
    """``Connection: close`` is honoured on both paths, also when the message
    ends with its head (where llhttp forgets the option once it is parsed)."""
    with socket.create_connection(("127.0.0.1", gateway.ports[listener]), timeout=5) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        for _ in range(100):
            chunk = sock.recv(65536)  # a socket left open times out here
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 ")
