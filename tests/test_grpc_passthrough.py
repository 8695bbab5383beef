"""V2 gRPC -> V2 gRPC pass-through, byte for byte, against a stand-in
upstream that records what it receives (tests/peers/grpc_standin.py).

The client side is a plain grpc channel sending and receiving bytes, so
the tests see exactly what travels. The same scenarios with
``passthrough: false`` show what a re-encode changes, so every equality
below could fail.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np
import pytest

from gateway.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from gateway.protocols.v2_grpc import codec
from gateway.protocols.v2_grpc import messages as pb
from peers.grpc_standin import GrpcStandin
from support import InProcessGateway

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


# Bytes a re-encode by the gateway's schema would drop: an unknown top-level
# field 99 (varint 7), and a parameter "future" whose InferParameter uses a
# field (9) our schema lacks.
UNKNOWN = _varint(99 << 3) + _varint(7) + _field(4, _field(1, b"future") + _field(2, _varint(9 << 3) + _varint(1)))


def client_request(model: str = "simple", outputs: tuple[str, ...] = (), **parameters: Any) -> bytes:
    request = InferRequest(model, "", "req-1", [Tensor.from_numpy("INPUT0", A), Tensor.from_numpy("INPUT1", B)],
                           [RequestedOutput(name) for name in outputs], dict(parameters))
    return codec.encode_infer_request(request) + UNKNOWN


def standin_reply(request: bytes) -> bytes:
    """What an upstream answers: its own model name (as MLServer does), the
    request's id, sum and difference, raw; plus fields the gateway does not know."""
    asked = pb.ModelInferRequest.FromString(request)
    a, b = (np.frombuffer(raw, dtype=np.int32).reshape(1, 16) for raw in asked.raw_input_contents)
    response = InferResponse(asked.model_name, asked.model_version, asked.id,
                             [Tensor.from_numpy("OUTPUT0", a + b), Tensor.from_numpy("OUTPUT1", a - b)],
                             {"served_by": "standin"})
    return codec.encode_infer_response(response) + UNKNOWN


def gateway_config(standin: GrpcStandin, passthrough: bool = True, route: str = "upstream: up",
                   extra_upstreams: str = "", output_contents: str = "raw") -> str:
    return f"""
listeners:
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0", output_contents: {output_contents}}}
upstreams:
  - {{name: up, protocol: v2-grpc, endpoints: ["{standin.address}"], passthrough: {str(passthrough).lower()}}}
  - {{name: local, protocol: builtin}}
{extra_upstreams}
routes:
  - match: {{model: alias}}
    upstream: up
    rewrite: {{model: simple, version: "3"}}
  - match: {{model: "*"}}
    {route}
"""


@pytest.fixture
async def standin() -> AsyncIterator[GrpcStandin]:
    async with GrpcStandin(standin_reply) as peer:
        yield peer


async def call(gateway: InProcessGateway, request: bytes, timeout: float = 10.0) -> bytes:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.gateway.ports['grpc']}") as channel:
        infer: Callable[..., Any] = channel.unary_unary(pb.method_path("ModelInfer"))
        reply: bytes = await infer(request, timeout=timeout)
        return reply


def passthrough_count(gateway: InProcessGateway, mode: str, upstream: str = "up") -> float:
    value = gateway.gateway.services.metrics.registry.get_sample_value(
        "gateway_passthrough_requests_total",
        {"listener": "grpc", "protocol": "v2-grpc", "upstream": upstream, "mode": mode})
    return value or 0.0


async def test_bytes_go_through_unchanged_both_ways(standin: GrpcStandin) -> None:
    request = client_request(tenant="blue")
    async with InProcessGateway(gateway_config(standin)) as gateway:
        reply = await call(gateway, request)
        assert standin.received == [request]
        assert reply == standin_reply(request)  # unknown fields and parameter kinds included
        assert passthrough_count(gateway, "verbatim") == 1
        assert passthrough_count(gateway, "translated") == passthrough_count(gateway, "request_only") == 0


async def test_switched_off_it_translates(standin: GrpcStandin) -> None:
    """passthrough: false re-encodes: what the gateway does not know is lost,
    the tensors and known fields are the same."""
    request = client_request(tenant="blue")
    async with InProcessGateway(gateway_config(standin, passthrough=False)) as gateway:
        reply = await call(gateway, request)
        assert standin.received[0] != request and UNKNOWN not in standin.received[0]
        assert reply != standin_reply(request) and UNKNOWN not in reply
        sent, relayed = pb.ModelInferRequest.FromString(standin.received[0]), pb.ModelInferResponse.FromString(reply)
        assert list(sent.raw_input_contents) == [A.tobytes(), B.tobytes()]
        assert sent.parameters["tenant"].string_param == "blue"
        assert list(relayed.raw_output_contents) == [(A + B).tobytes(), (A - B).tobytes()]
        assert passthrough_count(gateway, "translated") == 1
        assert passthrough_count(gateway, "verbatim") == 0


@pytest.mark.parametrize("passthrough", [True, False])
async def test_rewrite_by_appended_fields(standin: GrpcStandin, passthrough: bool) -> None:
    """The route renames alias -> simple version 3: upstream sees the new
    name (appended fields win), the client its own, as when translating."""
    request = client_request("alias")
    async with InProcessGateway(gateway_config(standin, passthrough)) as gateway:
        reply = pb.ModelInferResponse.FromString(await call(gateway, request))
    sent = pb.ModelInferRequest.FromString(standin.received[0])
    assert (sent.model_name, sent.model_version, sent.id) == ("simple", "3", "req-1")
    assert (reply.model_name, reply.model_version, reply.id) == ("alias", "", "req-1")
    if passthrough:
        assert standin.received[0].startswith(request)  # the client's bytes, then the new name and version
        assert UNKNOWN in standin.received[0]


async def test_outputs_changed_on_the_way_are_re_encoded(standin: GrpcStandin) -> None:
    """Output selection drops an output the upstream sent: the reply is
    re-encoded (the request still went verbatim)."""
    request = client_request(outputs=("OUTPUT1",))
    async with InProcessGateway(gateway_config(standin)) as gateway:
        reply = pb.ModelInferResponse.FromString(await call(gateway, request))
        assert standin.received == [request]
        assert [o.name for o in reply.outputs] == ["OUTPUT1"]
        assert list(reply.raw_output_contents) == [(A - B).tobytes()]
        assert passthrough_count(gateway, "request_only") == 1


async def test_classification_is_translated(standin: GrpcStandin) -> None:
    """The gateway classifies: the upstream must get the request without the
    classification parameter (a Triton would classify too), so re-encoded."""
    request = client_request()
    message = pb.ModelInferRequest.FromString(request)
    message.outputs.add(name="OUTPUT0").parameters["classification"].int64_param = 2
    async with InProcessGateway(gateway_config(standin)) as gateway:
        reply = pb.ModelInferResponse.FromString(await call(gateway, message.SerializeToString()))
    sent = pb.ModelInferRequest.FromString(standin.received[0])
    assert [dict(o.parameters) for o in sent.outputs] == [{}]
    assert [o.datatype for o in reply.outputs] == ["BYTES"]


async def test_typed_listener_gets_typed_contents(standin: GrpcStandin) -> None:
    async with InProcessGateway(gateway_config(standin, output_contents="typed")) as gateway:
        reply = pb.ModelInferResponse.FromString(await call(gateway, client_request()))
    assert not reply.raw_output_contents
    assert list(reply.outputs[0].contents.int_contents) == (A + B).reshape(-1).tolist()


async def test_retry_sends_the_same_bytes_again(standin: GrpcStandin) -> None:
    route = "upstream: up\n    retry: {attempts: 2, retry_on: [unavailable], backoff: 1ms}"
    standin.failures.append(grpc.StatusCode.UNAVAILABLE)
    request = client_request()
    async with InProcessGateway(gateway_config(standin, route=route)) as gateway:
        reply = await call(gateway, request)
    assert standin.received == [request, request]
    assert reply == standin_reply(request)


@pytest.mark.parametrize(("upstream_code", "client_code"), [
    (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INVALID_ARGUMENT),
    (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.NOT_FOUND),
    (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
    (grpc.StatusCode.INTERNAL, grpc.StatusCode.INTERNAL),
])
async def test_upstream_errors_keep_their_mapping(standin: GrpcStandin, upstream_code: grpc.StatusCode,
                                                  client_code: grpc.StatusCode) -> None:
    standin.failures.append(upstream_code)
    async with InProcessGateway(gateway_config(standin)) as gateway:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(gateway, client_request())
    assert info.value.code() == client_code
    details = info.value.details() or ""
    assert details.startswith("upstream up ") and standin.address not in details  # the upstream, not its address


async def test_a_broken_reply_is_not_relayed(standin: GrpcStandin) -> None:
    """The upstream's bytes are still decoded: garbage is INTERNAL, not relayed."""
    standin.reply = lambda request: b"\x0a\xff\xff\xff"
    async with InProcessGateway(gateway_config(standin)) as gateway:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(gateway, client_request())
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "not a valid inference.ModelInferResponse" in (info.value.details() or "")


def _mixed_request() -> bytes:
    message = pb.ModelInferRequest(model_name="simple")
    message.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16]).contents.int_contents.extend(range(16))
    message.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    message.raw_input_contents.extend([A.tobytes(), B.tobytes()])
    return bytes(message.SerializeToString())


def _short_request() -> bytes:
    message = pb.ModelInferRequest(model_name="simple")
    message.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    message.raw_input_contents.append(A.tobytes()[:60])
    return bytes(message.SerializeToString())


@pytest.mark.parametrize(("request_bytes", "says"), [
    (_mixed_request(), "mixes raw_input_contents with typed input contents"),
    (_short_request(), "input 'INPUT0'"),
    (b"\x0a\x05simple\x2a\xff", "not a valid inference.ModelInferRequest"),
])
async def test_invalid_requests_never_reach_the_upstream(standin: GrpcStandin, request_bytes: bytes,
                                                         says: str) -> None:
    async with InProcessGateway(gateway_config(standin)) as gateway:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(gateway, request_bytes)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in (info.value.details() or "")
    assert standin.received == []


async def test_split_with_a_builtin_upstream(standin: GrpcStandin) -> None:
    """Half the requests go to the builtin model, which uses the decoded
    tensors; the other half pass through. Both answer correctly."""
    route = "split: [{upstream: up, weight: 50}, {upstream: local, weight: 50}]"
    request = client_request()
    async with InProcessGateway(gateway_config(standin, route=route)) as gateway:
        replies = [await call(gateway, request) for _ in range(24)]
    passed = [r for r in replies if r == standin_reply(request)]
    builtin = [pb.ModelInferResponse.FromString(r) for r in replies if r != standin_reply(request)]
    assert 0 < len(passed) < 24 and len(standin.received) == len(passed)
    for reply in builtin:
        assert reply.model_name == "simple" and UNKNOWN not in reply.SerializeToString()
        assert list(reply.raw_output_contents) == [(A + B).tobytes(), (A - B).tobytes()]


async def test_mirror_gets_the_same_bytes(standin: GrpcStandin) -> None:
    async with GrpcStandin(standin_reply) as shadow:
        extra = f'  - {{name: shadow, protocol: v2-grpc, endpoints: ["{shadow.address}"]}}'
        route = "upstream: up\n    mirror: [{upstream: shadow}, {upstream: local}]"
        request = client_request()
        async with InProcessGateway(gateway_config(standin, route=route, extra_upstreams=extra)) as gateway:
            assert await call(gateway, request) == standin_reply(request)
            for _ in range(200):  # the copy is fire-and-forget
                if shadow.received:
                    break
                await asyncio.sleep(0.01)
        assert shadow.received == [request]
