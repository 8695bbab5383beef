"""Listener authentication: tokens from files or the environment, refused
in each protocol's own error form, health left open, tokens never shown.

The gateway runs in the test's event loop; clients are aiohttp and grpc.aio
over loopback sockets.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml
from graphstorm_payloads import movielens
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from security_support import BUILTIN_BACKEND, write_token

from gateway.app.configure import parse_config
from gateway.config.auth import CredentialConfig, SecretRef
from gateway.config.node import ConfigError
from gateway.protocols.v2_grpc import messages as pb
from gateway.runtime.auth import Authenticator
from support import InProcessGateway

TOKENS = ("first-token-A1", "second-token-with-another-length-B2")  # two accepted: rotation
API_KEY = "api-key-C3"


def _config(tokens: Path) -> str:
    auth = f'auth: {{token: {{file: "{tokens}"}}}}'
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0", {auth}}}
  - {{name: rest_key, protocol: v2-rest, address: "127.0.0.1:0",
     auth: {{token: {{env: GW_TEST_API_KEYS}}, header: X-Api-Key}}}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0", {auth}}}
  - {{name: umb, protocol: umbridge, address: "127.0.0.1:0", {auth}}}
  - {{name: gs, protocol: graphstorm, address: "127.0.0.1:0", {auth}}}
""" + BUILTIN_BACKEND


@pytest.fixture
async def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[InProcessGateway]:
    monkeypatch.setenv("GW_TEST_API_KEYS", f"unused-key, {API_KEY}")
    async with InProcessGateway(_config(write_token(tmp_path / "tokens", *TOKENS))) as gw:
        yield gw


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def call(gw: InProcessGateway, listener: str, method: str, path: str, headers: dict[str, str] | None = None,
               **kwargs: Any) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as session, session.request(
            method, gw.url(listener) + path, headers=headers, **kwargs) as response:
        return response.status, await response.json(content_type=None), response.headers


# --- each protocol's own refusal ----------------------------------------------------------


async def test_v2_rest(gateway: InProcessGateway) -> None:
    status, body, headers = await call(gateway, "rest", "GET", "/v2/models/simple")
    assert (status, body) == (401, {"error": "credentials are required: send 'authorization: Bearer <token>'"})
    assert headers["WWW-Authenticate"] == 'Bearer realm="inference-gateway"'
    for wrong in (bearer("first-token-A"), bearer(TOKENS[0] + "x"), {"Authorization": f"Basic {TOKENS[0]}"},
                  bearer("")):
        status, body, _ = await call(gateway, "rest", "GET", "/v2/models/simple", wrong)
        assert status == 401 and "credentials" in body["error"] and TOKENS[0] not in body["error"]
    for token in TOKENS:
        status, body, _ = await call(gateway, "rest", "GET", "/v2/models/simple", bearer(token))
        assert status == 200 and body["name"] == "simple"
    status, _, _ = await call(gateway, "rest", "GET", "/v2/models/simple", {"Authorization": f"bearer  {TOKENS[1]}"})
    assert status == 200  # the scheme is case-insensitive (RFC 9110)
    status, _, _ = await call(gateway, "rest", "POST", "/v2/models/simple/infer", json={"inputs": []})
    assert status == 401  # refused before the body is read


async def test_v2_rest_health_needs_no_token(gateway: InProcessGateway) -> None:
    async with aiohttp.ClientSession() as session:
        for path in ("/v2/health/live", "/v2/health/ready"):
            async with session.get(gateway.url("rest") + path) as response:
                assert response.status == 200


async def test_api_key_header_from_the_environment(gateway: InProcessGateway) -> None:
    status, _, _ = await call(gateway, "rest_key", "GET", "/v2/models/simple", {"X-Api-Key": API_KEY})
    assert status == 200
    status, body, headers = await call(gateway, "rest_key", "GET", "/v2/models/simple", bearer(API_KEY))
    assert (status, body) == (401, {"error": "credentials are required: send 'x-api-key: <token>'"})
    assert "WWW-Authenticate" not in headers  # no HTTP authentication scheme for a bare key


async def test_v2_grpc(gateway: InProcessGateway) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.gateway.ports['grpc']}") as channel:
        def method(name: str) -> Any:
            request_class, response_class = pb.METHODS[name]
            return channel.unary_unary(pb.method_path(name), request_serializer=request_class.SerializeToString,
                                       response_deserializer=response_class.FromString)

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await method("ModelMetadata")(pb.ModelMetadataRequest(name="simple"), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert refused.value.details() == "credentials are required: send 'authorization: Bearer <token>'"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await method("ModelInfer")(pb.ModelInferRequest(model_name="simple"), timeout=10,
                                       metadata=(("authorization", "Bearer nope"),))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        metadata = await method("ModelMetadata")(pb.ModelMetadataRequest(name="simple"), timeout=10,
                                                 metadata=(("authorization", f"Bearer {TOKENS[1]}"),))
        assert metadata.name == "simple"
        # Probes: the V2 liveness/readiness methods and grpc.health.v1 stay open.
        assert (await method("ServerLive")(pb.ServerLiveRequest(), timeout=10)).live
        assert (await method("ServerReady")(pb.ServerReadyRequest(), timeout=10)).ready
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        # Reflection describes the service: it needs the token too.
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in reflect.ServerReflectionInfo(iter([ask]), timeout=10):
                pass
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answers = [a async for a in reflect.ServerReflectionInfo(
            iter([ask]), timeout=10, metadata=(("authorization", f"Bearer {TOKENS[0]}"),))]
        assert pb.SERVICE in [s.name for s in answers[0].list_services_response.service]


async def test_umbridge(gateway: InProcessGateway) -> None:
    evaluate = {"name": "forward", "input": [[2.0, 5.0], [-1.0]]}
    for method, path, body in (("GET", "/Info", None), ("POST", "/Evaluate", evaluate)):
        status, answer, _ = await call(gateway, "umb", method, path, json=body)
        assert status == 401
        assert answer == {"error": {"type": "Unauthenticated",
                                    "message": "credentials are required: send 'authorization: Bearer <token>'"}}
    status, answer, _ = await call(gateway, "umb", "POST", "/Evaluate", bearer(TOKENS[0]), json=evaluate)
    assert (status, answer) == (200, {"output": [[7.0, -2.0, 25.0]]})


async def test_graphstorm(gateway: InProcessGateway) -> None:
    status, answer, _ = await call(gateway, "gs", "POST", "/invocations", bearer("wrong"), json=movielens())
    # HTTP 401 for callers that read the status; GraphStorm's envelope, its
    # status_code from the error table (400: a request the endpoint refuses).
    assert status == 401
    assert answer == {"status_code": 400, "request_uid": "", "message": "",
                      "error": "the credentials are not valid", "data": {}}
    status, answer, _ = await call(gateway, "gs", "GET", "/ping")
    assert (status, answer) == (200, {"status": "Healthy"})
    status, answer, _ = await call(gateway, "gs", "POST", "/invocations", bearer(TOKENS[0]), json=movielens())
    assert status == 200 and answer["status_code"] == 200


async def test_tokens_never_appear_in_config_or_metrics(gateway: InProcessGateway) -> None:
    async with aiohttp.ClientSession() as session:
        admin = f"http://127.0.0.1:{gateway.gateway.admin_port}"
        await call(gateway, "rest", "GET", "/v2/models/simple", bearer("wrong-token"))
        async with session.get(admin + "/config") as response:
            config_text = await response.text()
        async with session.get(admin + "/metrics") as response:
            metrics_text = await response.text()
    for secret in (*TOKENS, API_KEY, "wrong-token"):
        assert secret not in config_text and secret not in metrics_text
        assert secret not in repr(gateway.gateway.config)
    assert '"auth": "<redacted>"' in config_text
    assert 'listener="rest"' in metrics_text and 'outcome="unauthenticated"' in metrics_text


# --- configuration ---------------------------------------------------------------------


def _problems(text: str, base_dir: Path) -> str:
    with pytest.raises(ConfigError) as error:
        parse_config(yaml.safe_load(text), "<test>", base_dir)
    return "\n".join(error.value.problems)


def test_config_refuses_inline_tokens_and_unreadable_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GW_TEST_UNSET", raising=False)
    (tmp_path / "empty").write_text("# nothing but a comment\n")
    problems = _problems("""
listeners:
  - {name: a, protocol: v2-rest, address: "127.0.0.1:0", auth: {token: "s3cr3t"}}
  - {name: b, protocol: v2-rest, address: "127.0.0.1:0", auth: {token: {file: missing}}}
  - {name: c, protocol: v2-rest, address: "127.0.0.1:0", auth: {token: {env: GW_TEST_UNSET}}}
  - {name: d, protocol: v2-rest, address: "127.0.0.1:0", auth: {token: {file: empty}, header: "bad header"}}
upstreams:
  - {name: u, protocol: v2-rest, endpoints: ["127.0.0.1:1"], auth: {token: {file: missing, env: X}}}
routes: []
admin: {token: plain}
""", tmp_path)
    assert "listeners[0].auth.token: must be {file: PATH} or {env: VARIABLE}; tokens are never written" in problems
    assert f"listeners[1].auth.token: cannot read token file {tmp_path / 'missing'}" in problems
    assert "listeners[2].auth.token: environment variable GW_TEST_UNSET is not set" in problems
    assert f"listeners[3].auth.token: file {tmp_path / 'empty'} holds no token" in problems
    assert "listeners[3].auth.header: is not a valid header name" in problems
    assert "upstreams[0].auth.token: must be {file: PATH} or {env: VARIABLE}" in problems
    assert "admin.token: must be {file: PATH} or {env: VARIABLE}" in problems
    assert "s3cr3t" not in problems


def test_config_checks_tls_blocks(tmp_path: Path) -> None:
    (tmp_path / "c.pem").write_text("x")
    problems = _problems("""
listeners:
  - {name: a, protocol: v2-rest, address: "127.0.0.1:0", tls: {cert: c.pem}}
  - {name: b, protocol: v2-grpc, address: "127.0.0.1:0", tls: {cert: c.pem, key: c.pem, ca: c.pem,
     client_auth: optional}}
  - {name: c, protocol: umbridge, address: "127.0.0.1:0", tls: {cert: c.pem, key: nope.pem, client_auth: require}}
  - {name: d, protocol: graphstorm, address: "127.0.0.1:0", tls: {cert: c.pem, key: c.pem, server_name: x}}
upstreams:
  - {name: u, protocol: v2-grpc, endpoints: ["127.0.0.1:1"], tls: {cert: c.pem, client_auth: require}}
routes: []
""", tmp_path)
    assert "listeners[0].tls.key: is required on a listener" in problems
    assert "listeners[1].tls.client_auth: optional is not available on this listener; use none or require" \
        in problems
    assert f"listeners[2].tls.key: cannot read {tmp_path / 'nope.pem'}" in problems
    assert "listeners[2].tls.ca: client_auth: require needs ca" in problems
    assert "listeners[3].tls.server_name: unknown key" in problems
    assert "upstreams[0].tls.key: cert and key go together" in problems
    assert "upstreams[0].tls.client_auth: unknown key" in problems


# --- the checker itself ---------------------------------------------------------------


def test_authenticator_accepts_exactly_the_listed_tokens(tmp_path: Path) -> None:
    path = write_token(tmp_path / "t", "alpha", "b" * 200)
    checker = Authenticator(CredentialConfig(SecretRef(file=path)))
    for good in ("Bearer alpha", "bearer alpha", "BEARER   alpha  ", f"Bearer {'b' * 200}"):
        checker.check({"authorization": good})
    for bad in ("Bearer alph", "Bearer alpha2", "Bearer", "alpha", "Token alpha", "Bearer " + "b" * 199,
                "Bearer # accepted tokens, one per line"):
        with pytest.raises(Exception, match="credentials"):
            checker.check({"authorization": bad})
