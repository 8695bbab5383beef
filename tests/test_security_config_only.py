"""No way around the config: nothing in a request chooses where the gateway
connects; model names are checked at the data plane's entry; the admin
listener's write endpoints need a token when exposed.

A *canary* socket on loopback counts connections: requests naming it in
headers, model names, gRPC authority or GraphStorm's target-model header
must never reach it. The configured upstream is a second gateway (builtin
models) in the same event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from graphstorm_payloads import movielens
from security_support import BUILTIN_BACKEND
from yarl import URL

from gateway.app.admin import build_admin_app, is_loopback
from gateway.app.configure import load_config
from gateway.app.server import Gateway
from gateway.core.errors import GatewayError
from gateway.core.modelnames import MAX_MODEL_NAME_CHARS, check_model
from gateway.protocols.v2_grpc import messages as pb
from support import SIMPLE_INFER_REQUEST, InProcessGateway, parse_yaml_config

UPSTREAM = """
admin: {address: null}
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
  - {name: umb, protocol: umbridge, address: "127.0.0.1:0"}
  - {name: gs, protocol: graphstorm, address: "127.0.0.1:0"}
""" + BUILTIN_BACKEND


def front_config(ports: dict[str, int]) -> str:
    return f"""
admin: {{address: null}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
  - {{name: umb, protocol: umbridge, address: "127.0.0.1:0"}}
  - {{name: gs, protocol: graphstorm, address: "127.0.0.1:0"}}
upstreams:
  - {{name: u-rest, protocol: v2-rest, endpoints: ["127.0.0.1:{ports['rest']}"], timeout: 10s}}
  - {{name: u-umb, protocol: umbridge, endpoints: ["127.0.0.1:{ports['umb']}"], timeout: 10s}}
  - {{name: u-gs, protocol: graphstorm, endpoints: ["127.0.0.1:{ports['gs']}"], timeout: 10s}}
routes:
  - {{match: {{listener: gs}}, upstream: u-gs}}
  - {{match: {{listener: umb}}, upstream: u-umb}}
  - {{match: {{model: "*"}}, upstream: u-rest}}
"""


class Canary:
    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.close()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])


@pytest.fixture
async def setup() -> AsyncIterator[tuple[InProcessGateway, Canary, str]]:
    canary = Canary()
    target = f"127.0.0.1:{await canary.start()}"
    async with InProcessGateway(UPSTREAM) as upstream:
        async with InProcessGateway(front_config(upstream.gateway.ports)) as front:
            yield front, canary, target
    assert canary.server is not None
    canary.server.close()


async def fetch(method: str, url: str | URL, **kwargs: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.request(method, url, **kwargs) as response:
        return response.status, await response.json(content_type=None)


async def test_v2_rest_headers_and_names_cannot_redirect(setup: tuple[InProcessGateway, Canary, str]) -> None:
    front, canary, target = setup
    base = front.url("rest")
    steering = {"Host": target, "X-Forwarded-Host": target, "X-Forwarded-For": "127.0.0.1",
                "Forwarded": f"host={target};proto=http", "X-Original-URL": f"http://{target}/",
                "X-Rewrite-URL": f"http://{target}/", "X-Amzn-SageMaker-Target-Model": f"http://{target}/"}
    status, body = await fetch("POST", f"{base}/v2/models/simple/infer", json=SIMPLE_INFER_REQUEST, headers=steering)
    assert status == 200 and body["model_name"] == "simple"  # served by the configured upstream
    status, body = await fetch("GET", f"{base}/v2/models/{target}/ready")
    assert status == 404 and body["error"].endswith(f"answered 404: Request for unknown model: '{target}' is not found")
    # Raw paths, sent exactly as written (no client-side normalisation).
    for path, status_wanted, message in [
        (f"/v2/models/http:%2F%2F{target}%2F/ready", 400, "contains a path separator"),
        ("/v2/models/..%2Fsimple/ready", 400, "contains a path separator"),
        ("/v2/models/%2E%2E/ready", 400, "contains '..'"),
        ("/v2/models/a..b/ready", 400, "contains '..'"),
        ("/v2/models/simple%5C..%5Cx/ready", 400, "contains a path separator"),
        ("/v2/models/sim%00ple/ready", 400, "contains control characters"),
        ("/v2/models/sim%0Aple/ready", 400, "contains control characters"),
        ("/v2/models/simple/versions/..%2F1/ready", 400, "model version"),
        (f"/v2/models/{'m' * (MAX_MODEL_NAME_CHARS + 1)}/ready", 400, "over the limit of 256"),
    ]:
        status, body = await fetch("GET", URL(base + path, encoded=True))
        assert status == status_wanted and message in body["error"], (path, body)
    assert canary.connections == 0


async def test_v2_grpc_names_and_authority_cannot_redirect(setup: tuple[InProcessGateway, Canary, str]) -> None:
    front, canary, target = setup
    options = [("grpc.default_authority", target)]  # the :authority a client claims
    async with grpc.aio.insecure_channel(f"127.0.0.1:{front.gateway.ports['grpc']}", options=options) as channel:
        metadata_call = channel.unary_unary(pb.method_path("ModelMetadata"),
                                            request_serializer=pb.ModelMetadataRequest.SerializeToString,
                                            response_deserializer=pb.ModelMetadataResponse.FromString)
        steering = (("x-forwarded-host", target), ("host", target))
        assert (await metadata_call(pb.ModelMetadataRequest(name="simple"), metadata=steering, timeout=10)).name \
            == "simple"
        for name, code, message in [
            (target, grpc.StatusCode.NOT_FOUND, f"unknown model: '{target}' is not found"),
            (f"http://{target}/", grpc.StatusCode.INVALID_ARGUMENT, "contains a path separator"),
            ("..", grpc.StatusCode.INVALID_ARGUMENT, "contains '..'"),
            ("sim\x7fple", grpc.StatusCode.INVALID_ARGUMENT, "contains control characters"),
            ("", grpc.StatusCode.INVALID_ARGUMENT, "model name is empty"),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await metadata_call(pb.ModelMetadataRequest(name=name), timeout=10)
            assert error.value.code() == code and message in (error.value.details() or ""), name
    assert canary.connections == 0


async def test_umbridge_names_cannot_redirect(setup: tuple[InProcessGateway, Canary, str]) -> None:
    front, canary, target = setup
    for name, message in [(f"http://{target}/forward", "contains a path separator"),
                          ("../forward", "contains a path separator"), ("for..ward", "contains '..'")]:
        status, body = await fetch("POST", front.url("umb") + "/Evaluate",
                                   json={"name": name, "input": [[2.0, 5.0], [-1.0]]}, headers={"Host": target})
        assert status == 400 and body["error"]["type"] == "InvalidInput" and message in body["error"]["message"]
    status, body = await fetch("POST", front.url("umb") + "/Evaluate", headers={"Host": target},
                               json={"name": "forward", "input": [[2.0, 5.0], [-1.0]]})
    assert (status, body) == (200, {"output": [[7.0, -2.0, 25.0]]})
    assert canary.connections == 0


async def test_graphstorm_target_model_header_cannot_redirect(setup: tuple[InProcessGateway, Canary, str]) -> None:
    front, canary, target = setup
    url = front.url("gs") + "/invocations"
    for header, message in [(f"http://{target}/gnn", "contains a path separator"), ("../gnn", "path separator"),
                            ("g\tnn", "control characters")]:
        status, body = await fetch("POST", url, json=movielens(), headers={"X-Amzn-SageMaker-Target-Model": header})
        assert status == 200 and body["status_code"] == 400 and message in body["error"], body
    status, body = await fetch("POST", url, json=movielens(),
                               headers={"X-Amzn-SageMaker-Target-Model": target, "Host": target})
    # routed, not dialled
    assert body["status_code"] == 500 and f"unknown model: '{target}' is not found" in body["error"]
    status, body = await fetch("POST", url, json=movielens(), headers={"X-Amzn-SageMaker-Target-Model": "gnn"})
    assert body["status_code"] == 200
    assert canary.connections == 0


async def test_upstream_redirects_are_not_followed() -> None:
    """A (misbehaving) upstream answering 307 toward the canary: an error
    answer, never a connection there. The redirecting server is a stand-in:
    no real peer redirects on purpose."""
    canary = Canary()
    target = f"127.0.0.1:{await canary.start()}"

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"http://{target}{request.path}")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", redirect)
    redirector = TestServer(app, host="127.0.0.1")
    await redirector.start_server()
    endpoint = f'["127.0.0.1:{redirector.port}"]'
    config = f"""
admin: {{address: null}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: umb, protocol: umbridge, address: "127.0.0.1:0"}}
  - {{name: gs, protocol: graphstorm, address: "127.0.0.1:0"}}
upstreams:
  - {{name: r, protocol: v2-rest, endpoints: {endpoint}}}
  - {{name: u, protocol: umbridge, endpoints: {endpoint}}}
  - {{name: g, protocol: graphstorm, endpoints: {endpoint}}}
routes:
  - {{match: {{listener: gs}}, upstream: g}}
  - {{match: {{listener: umb}}, upstream: u}}
  - {{match: {{model: "*"}}, upstream: r}}
"""
    try:
        async with InProcessGateway(config) as gw:
            status, body = await fetch("POST", gw.url("rest") + "/v2/models/simple/infer", json=SIMPLE_INFER_REQUEST)
            assert status == 502 and "answered 307" in body["error"]
            status, body = await fetch("POST", gw.url("umb") + "/Evaluate", json={"name": "m", "input": [[1.0]]})
            assert status == 500 and body["error"]["type"] == "InvalidOutput" and "307" in body["error"]["message"]
            status, body = await fetch("POST", gw.url("gs") + "/invocations", json=movielens())
            assert body["status_code"] == 500 and "HTTP 307" in body["error"]
    finally:
        await redirector.close()
        assert canary.server is not None
        canary.server.close()
    assert canary.connections == 0


@pytest.mark.parametrize(("model", "version", "problem"), [
    ("m" * MAX_MODEL_NAME_CHARS, "", None),
    ("m" * (MAX_MODEL_NAME_CHARS + 1), "", "model name is 257 characters long, over the limit of 256"),
    ("resnet-50.v1_ok:x@y", "2", None),
    ("a/b", "", "model name 'a/b' contains a path separator"),
    ("a\\b", "", "contains a path separator"),
    ("..", "", "contains '..'"),
    ("a\u0085b", "", "contains control characters"),  # C1 control (NEL)
    ("ok", "1/2", "model version '1/2' contains a path separator"),
    ("", "", "model name is empty"),
])
def test_model_name_rules(model: str, version: str, problem: str | None) -> None:
    if problem is None:
        check_model(model, version)
        return
    with pytest.raises(GatewayError) as error:
        check_model(model, version)
    assert error.value.kind.value == "invalid_input" and problem in error.value.message


# --- admin -----------------------------------------------------------------------------


def test_admin_listens_on_loopback_by_default() -> None:
    assert load_config(None).admin.address is not None and load_config(None).admin.address.host == "127.0.0.1"
    assert parse_yaml_config("listeners: []\nupstreams: []\nroutes: []").admin.address.host == "127.0.0.1"  # type: ignore[union-attr]


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.1.2.3", False), ("admin.internal", False)])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


async def _admin_client(admin_yaml: str) -> TestClient[web.Request, web.Application]:
    """The admin app of a gateway configured with ``admin_yaml``, plus a
    stand-in write endpoint (POST /dummy), served on loopback whatever the
    configured address says."""
    config = parse_yaml_config(f"admin: {admin_yaml}\nlisteners: []\nupstreams: []\nroutes: []")
    app = build_admin_app(Gateway(config))

    async def dummy(request: web.Request) -> web.Response:
        return web.json_response({"done": True})

    app.router.add_post("/dummy", dummy)
    client: TestClient[web.Request, web.Application] = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    return client


async def test_admin_writes_refused_when_exposed_without_token() -> None:
    client = await _admin_client('{address: "0.0.0.0:8002"}')
    try:
        response = await client.post("/dummy")
        assert response.status == 403
        assert await response.json() == {"error": "admin write endpoints need admin.token when the admin address "
                                                  "is not loopback"}
        assert (await client.get("/healthz")).status == 200  # reads stay open (probes, scraping)
        assert (await client.get("/config")).status == 200
    finally:
        await client.close()


async def test_admin_writes_need_the_token_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_TEST_ADMIN_TOKEN", "admin-secret-9")
    for address in ("0.0.0.0:8002", "127.0.0.1:8002"):  # a token, once set, is required on loopback too
        client = await _admin_client(f'{{address: "{address}", token: {{env: GW_TEST_ADMIN_TOKEN}}}}')
        try:
            response = await client.post("/dummy")
            assert response.status == 401 and response.headers["WWW-Authenticate"].startswith("Bearer")
            assert (await client.post("/dummy", headers={"Authorization": "Bearer admin-secret"})).status == 401
            response = await client.post("/dummy", headers={"Authorization": "Bearer admin-secret-9"})
            assert response.status == 200 and await response.json() == {"done": True}
            assert (await client.delete("/config")).status == 401  # every non-GET method
            assert "admin-secret-9" not in await (await client.get("/config")).text()
        finally:
            await client.close()


async def test_admin_writes_open_on_loopback_without_token() -> None:
    client = await _admin_client('{address: "127.0.0.1:8002"}')
    try:
        assert (await client.post("/dummy")).status == 200
    finally:
        await client.close()
