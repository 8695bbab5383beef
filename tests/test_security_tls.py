"""TLS and mTLS on every listener and toward every upstream protocol, with
real clients, and the credentials an upstream wants injected by the gateway.

Two gateways, each in its own process: the *upstream* one serves the
builtin models on four TLS listeners (V2 REST, V2 gRPC, UM-Bridge,
GraphStorm) that require a client certificate and a token; the *front* one
serves plain loopback listeners and reaches the upstream one through TLS
upstreams. No UM-Bridge or GraphStorm server that speaks TLS can run here,
so the gateway's own listeners play those servers (their plain-text forms
are checked against the real peers elsewhere). Certificates come from
``trustme``; every address is 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import umbridge
from graphstorm_payloads import movielens
from security_support import BUILTIN_BACKEND, Pki, make_pki, write_token

from support import SIMPLE_INFER_REQUEST, GatewayProcess, write_config

CLIENT_TOKEN = "client-token-1"
UPSTREAM_TOKEN = "upstream-token-2"
BEARER = {"Authorization": f"Bearer {CLIENT_TOKEN}"}

_SECURE = "tls: {cert: server.pem, key: server.key, ca: ca.pem, client_auth: require}, auth: {token: {file: tokens}}"
UPSTREAM_CONFIG = f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0", {_SECURE}}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0", {_SECURE}}}
  - {{name: umb, protocol: umbridge, address: "127.0.0.1:0", {_SECURE}}}
  - {{name: gs, protocol: graphstorm, address: "127.0.0.1:0", {_SECURE}}}
  # TLS only, for umbridge.HTTPModel (it can send neither a certificate nor a header)
  - {{name: umb_open, protocol: umbridge, address: "127.0.0.1:0", tls: {{cert: server.pem, key: server.key}}}}
""" + BUILTIN_BACKEND

_MTLS = "ca: ca.pem, cert: client.pem, key: client.key"
_TOKEN = "auth: {token: {file: upstream-token}}"


def front_config(ports: dict[str, int]) -> str:
    rest, grpc, umb, gs = (f'["127.0.0.1:{ports[n]}"]' for n in ("rest", "grpc", "umb", "gs"))
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: umb, protocol: umbridge, address: "127.0.0.1:0"}}
  - {{name: gs, protocol: graphstorm, address: "127.0.0.1:0"}}
upstreams:
  - {{name: u-rest, protocol: v2-rest, endpoints: {rest}, timeout: 10s, tls: {{{_MTLS}}}, {_TOKEN}}}
  - {{name: u-rest-named, protocol: v2-rest, endpoints: {rest}, timeout: 10s,
     tls: {{{_MTLS}, server_name: upstream.test}}, {_TOKEN}}}
  - {{name: u-rest-wrong-name, protocol: v2-rest, endpoints: {rest}, timeout: 10s,
     tls: {{{_MTLS}, server_name: wrong.test}}, {_TOKEN}}}
  - {{name: u-rest-no-cert, protocol: v2-rest, endpoints: {rest}, timeout: 10s, tls: {{ca: ca.pem}}, {_TOKEN}}}
  - {{name: u-rest-untrusted, protocol: v2-rest, endpoints: {rest}, timeout: 10s,
     tls: {{ca: other-ca.pem, cert: client.pem, key: client.key}}, {_TOKEN}}}
  - {{name: u-rest-no-token, protocol: v2-rest, endpoints: {rest}, timeout: 10s, tls: {{{_MTLS}}}}}
  - {{name: u-grpc, protocol: v2-grpc, endpoints: {grpc}, timeout: 10s,
     tls: {{{_MTLS}, server_name: upstream.test}}, {_TOKEN}}}
  - {{name: u-grpc-wrong-name, protocol: v2-grpc, endpoints: {grpc}, timeout: 10s,
     tls: {{{_MTLS}, server_name: wrong.test}}, {_TOKEN}}}
  - {{name: u-umb, protocol: umbridge, endpoints: {umb}, timeout: 10s, tls: {{{_MTLS}}}, {_TOKEN}}}
  - {{name: u-gs, protocol: graphstorm, endpoints: {gs}, timeout: 10s, tls: {{{_MTLS}}}, {_TOKEN}}}
routes:
  - {{match: {{model: gnn, listener: gs}}, upstream: u-gs}}
  - {{match: {{listener: umb}}, upstream: u-umb}}
  - {{match: {{model: via-rest}}, upstream: u-rest, rewrite: {{model: simple}}}}
  - {{match: {{model: via-rest-named}}, upstream: u-rest-named, rewrite: {{model: simple}}}}
  - {{match: {{model: via-rest-wrong-name}}, upstream: u-rest-wrong-name, rewrite: {{model: simple}}}}
  - {{match: {{model: via-rest-no-cert}}, upstream: u-rest-no-cert, rewrite: {{model: simple}}}}
  - {{match: {{model: via-rest-untrusted}}, upstream: u-rest-untrusted, rewrite: {{model: simple}}}}
  - {{match: {{model: via-rest-no-token}}, upstream: u-rest-no-token, rewrite: {{model: simple}}}}
  - {{match: {{model: via-rest-forwarding}}, upstream: u-rest-no-token, rewrite: {{model: simple}},
     forward_authorization: true}}
  - {{match: {{model: via-grpc}}, upstream: u-grpc, rewrite: {{model: simple}}}}
  - {{match: {{model: via-grpc-wrong-name}}, upstream: u-grpc-wrong-name, rewrite: {{model: simple}}}}
"""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("tls")
    pki = make_pki(folder)
    make_pki(folder / "other")  # a second CA the gateways do not trust
    (folder / "other-ca.pem").write_bytes((folder / "other" / "ca.pem").read_bytes())
    write_token(folder / "tokens", CLIENT_TOKEN, UPSTREAM_TOKEN)
    write_token(folder / "upstream-token", UPSTREAM_TOKEN)
    return pki


@pytest.fixture(scope="module")
def gateways(pki: Pki) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    folder = pki.folder
    with GatewayProcess(write_config(folder, UPSTREAM_CONFIG, "upstream.yaml"), folder / "upstream.log") as up:
        front_path = write_config(folder, front_config(up.ports), "front.yaml")
        with GatewayProcess(front_path, folder / "front.log") as front:
            yield up, front


@pytest.fixture(scope="module")
def upstream(gateways: tuple[GatewayProcess, GatewayProcess]) -> GatewayProcess:
    return gateways[0]


@pytest.fixture(scope="module")
def front(gateways: tuple[GatewayProcess, GatewayProcess]) -> GatewayProcess:
    return gateways[1]


def _simple_inputs(module: Any, a: np.ndarray) -> list[Any]:
    inputs = [module.InferInput(n, list(a.shape), "INT32") for n in ("INPUT0", "INPUT1")]
    for item in inputs:
        item.set_data_from_numpy(a)
    return inputs


# --- listeners, with real clients --------------------------------------------------


def _triton_http(upstream: GatewayProcess, pki: Pki, client_cert: bool) -> httpclient.InferenceServerClient:
    options = {"ca_certs": str(pki.ca)}
    if client_cert:
        options |= {"certfile": str(pki.client_cert), "keyfile": str(pki.client_key)}
    return httpclient.InferenceServerClient(upstream.url("rest"), ssl=True, ssl_options=options)


def test_tritonclient_http_over_mtls(upstream: GatewayProcess, pki: Pki) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    with _triton_http(upstream, pki, client_cert=True) as client:
        assert client.is_server_live() and client.is_server_ready()  # health needs no token
        result = client.infer("simple", _simple_inputs(httpclient, a), headers=dict(BEARER))  # it adds to the dict
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
        with pytest.raises(Exception, match="credentials are required"):
            client.infer("simple", _simple_inputs(httpclient, a))


def test_tritonclient_http_without_client_certificate_is_refused(upstream: GatewayProcess, pki: Pki) -> None:
    with _triton_http(upstream, pki, client_cert=False) as client, pytest.raises(Exception):  # noqa: B017
        client.is_server_live()  # the handshake fails: no HTTP answer at all


def _triton_grpc(upstream: GatewayProcess, pki: Pki, client_cert: bool) -> grpcclient.InferenceServerClient:
    certs = {"private_key": str(pki.client_key), "certificate_chain": str(pki.client_cert)} if client_cert else {}
    return grpcclient.InferenceServerClient(upstream.url("grpc"), ssl=True, root_certificates=str(pki.ca), **certs)


def test_tritonclient_grpc_over_mtls(upstream: GatewayProcess, pki: Pki) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    with _triton_grpc(upstream, pki, client_cert=True) as client:
        assert client.is_server_live() and client.is_server_ready()
        grpc_bearer = {"authorization": BEARER["Authorization"]}  # gRPC metadata keys are lower case
        result = client.infer("simple", _simple_inputs(grpcclient, a), headers=grpc_bearer)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - a)
        with pytest.raises(Exception, match="UNAUTHENTICATED"):
            client.infer("simple", _simple_inputs(grpcclient, a))


def test_tritonclient_grpc_without_client_certificate_is_refused(upstream: GatewayProcess, pki: Pki) -> None:
    with _triton_grpc(upstream, pki, client_cert=False) as client, pytest.raises(Exception, match="UNAVAILABLE"):
        client.is_server_live(client_timeout=10)


def test_umbridge_httpmodel_over_tls(upstream: GatewayProcess, pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(pki.ca))  # how a requests-based client trusts a private CA
    model = umbridge.HTTPModel(f"https://{upstream.url('umb_open')}", "forward")
    assert model([[2.0, 5.0], [-1.0]]) == [[7.0, -2.0, 25.0]]


def test_umbridge_and_graphstorm_listeners_over_mtls(upstream: GatewayProcess, pki: Pki) -> None:
    cert = (str(pki.client_cert), str(pki.client_key))
    info = requests.get(f"https://{upstream.url('umb')}/Info", cert=cert, verify=str(pki.ca), headers=BEARER,
                        timeout=10)
    assert info.status_code == 200 and "forward" in info.json()["models"]
    ping = requests.get(f"https://{upstream.url('gs')}/ping", cert=cert, verify=str(pki.ca), timeout=10)
    assert ping.status_code == 200  # health needs no token
    answer = requests.post(f"https://{upstream.url('gs')}/invocations", json=movielens(), cert=cert,
                           verify=str(pki.ca), headers=BEARER, timeout=10)
    assert answer.status_code == 200 and answer.json()["status_code"] == 200
    # Without a client certificate: no answer (under TLS 1.3 the refusal
    # reaches the client after its side of the handshake, as a closed connection).
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"https://{upstream.url('gs')}/ping", verify=str(pki.ca), timeout=10)


def test_plain_http_to_a_tls_listener_gets_no_answer(upstream: GatewayProcess) -> None:
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://{upstream.url('rest')}/v2/health/live", timeout=10)


# --- upstreams: TLS, mTLS, server name, injected credentials ---------------------


def _infer_via(front: GatewayProcess, model: str, headers: dict[str, str] | None = None) -> requests.Response:
    return requests.post(f"http://{front.url('rest')}/v2/models/{model}/infer", json=SIMPLE_INFER_REQUEST,
                         headers=headers, timeout=20)


@pytest.mark.parametrize("model", ["via-rest", "via-rest-named", "via-grpc"])
def test_upstream_over_mtls_with_injected_token(front: GatewayProcess, model: str) -> None:
    answer = _infer_via(front, model)
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
    assert outputs["OUTPUT0"] == [i + 1 for i in range(16)]


@pytest.mark.parametrize(("model", "status", "reason"), [
    ("via-rest-wrong-name", 503, "not valid for 'wrong.test'"),  # the certificate names 127.0.0.1, upstream.test
    ("via-grpc-wrong-name", 503, "Hostname Verification Check failed"),
    ("via-rest-no-cert", 503, "closed the connection"),  # the upstream requires a client certificate
    ("via-rest-untrusted", 503, "CERTIFICATE_VERIFY_FAILED"),  # the upstream's CA is not the one configured
    ("via-rest-no-token", 502, "answered 401: credentials are required"),  # no credential configured for it
])
def test_upstream_tls_failures(front: GatewayProcess, model: str, status: int, reason: str) -> None:
    answer = _infer_via(front, model)
    assert answer.status_code == status, answer.text
    assert reason in answer.json()["error"]


def test_client_authorization_is_forwarded_only_when_the_route_says_so(front: GatewayProcess) -> None:
    assert _infer_via(front, "via-rest-no-token", BEARER).status_code == 502  # never forwarded by default
    assert _infer_via(front, "via-rest-forwarding", BEARER).status_code == 200
    assert _infer_via(front, "via-rest-forwarding").status_code == 502  # nothing to forward


def test_umbridge_upstream_over_mtls(front: GatewayProcess) -> None:
    model = umbridge.HTTPModel(f"http://{front.url('umb')}", "forward")
    assert model([[2.0, 5.0], [-1.0]]) == [[7.0, -2.0, 25.0]]
    assert model.gradient(0, 1, [[2.0, 5.0], [-1.0]], [1.0, 2.0, 3.0]) == [4.0]


def test_graphstorm_upstream_over_mtls(front: GatewayProcess) -> None:
    answer = requests.post(f"http://{front.url('gs')}/invocations", json=movielens(), timeout=20)
    body = answer.json()
    assert answer.status_code == 200 and body["status_code"] == 200, body
    assert [r["node_id"] for r in body["data"]["results"]] == ["a1", "m2", "m1"]  # by node type


def test_gateway_logs_name_no_token(gateways: tuple[GatewayProcess, GatewayProcess], pki: Pki) -> None:
    for gateway in gateways:
        log = gateway.log()
        assert CLIENT_TOKEN not in log and UPSTREAM_TOKEN not in log
        assert "Traceback" not in log

