"""Every configured limit over real sockets, on each listener it applies to,
answered in that protocol's own error form; the gateway keeps serving after.

The gateway runs in the test's event loop with small limits. A "silent"
upstream (a loopback socket that reads requests and never answers) keeps
requests in flight for the concurrency and connection limits.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import orjson
import pytest
from graphstorm_payloads import movielens

from gateway.protocols.v2_grpc import messages as pb
from support import InProcessGateway

ELEMENTS = 1000  # max_request_elements
TENSOR_BYTES = 6000  # max_request_tensor_bytes
BYTES_ELEMENT = 64  # max_bytes_element
DEPTH = 16  # max_json_depth
CONNECTIONS = 6  # max_connections
REQUESTS = 2  # max_concurrent_requests
TIMEOUT = 1.0  # idle_timeout and body_timeout, seconds

CONFIG = f"""
admin: {{address: null}}
limits:
  max_request_bytes: 1MiB
  max_request_elements: {ELEMENTS}
  max_request_tensor_bytes: {TENSOR_BYTES}
  max_bytes_element: {BYTES_ELEMENT}
  max_json_depth: {DEPTH}
  max_header_line_bytes: 1KiB
  max_headers: 20
  max_grpc_metadata_bytes: 2KiB
  idle_timeout: {TIMEOUT}s
  body_timeout: {TIMEOUT}s
  max_connections: {CONNECTIONS}
  max_concurrent_requests: {REQUESTS}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
  - {{name: umb, protocol: umbridge, address: "127.0.0.1:0"}}
  - {{name: gs, protocol: graphstorm, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin}}
  - {{name: silent, protocol: v2-rest, endpoints: ["127.0.0.1:{{silent}}"], timeout: 2s, binary: always}}
routes:
  - match: {{model: slow}}
    upstream: silent
  - match: {{model: gnn-slow}}
    upstream: silent
  - match: {{model: "*"}}
    upstream: local
"""
IDENTITY = "/v2/models/identity/infer"
JSON = {"Content-Type": "application/json"}
GOOD_UMBRIDGE = {"name": "forward", "input": [[1.0, 2.0], [3.0]]}


class Silent:
    """A loopback server that reads whatever comes and never answers."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.writers.append(writer)
            while await reader.read(65536):
                pass

        self.server = await asyncio.start_server(swallow, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        for writer in self.writers:
            writer.close()
        if self.server is not None:
            self.server.close()


@pytest.fixture
async def gateway() -> AsyncIterator[InProcessGateway]:
    silent = Silent()
    port = await silent.start()
    async with InProcessGateway(CONFIG.replace("{silent}", str(port))) as gw:
        yield gw
    await silent.stop()


def base(gw: InProcessGateway, listener: str) -> str:
    return gw.url(listener)


async def post_json(session: aiohttp.ClientSession, url: str, body: bytes,
                    headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with session.post(url, data=body, headers=headers or JSON) as response:
        assert response.content_type == "application/json", await response.text()
        return response.status, orjson.loads(await response.read())


def identity_json(*inputs: tuple[str, list[int], Any], parameters: Any = None) -> bytes:
    obj: dict[str, Any] = {"inputs": [{"name": f"INPUT{i}", "datatype": dt, "shape": shape, "data": data}
                                      for i, (dt, shape, data) in enumerate(inputs)]}
    if parameters is not None:
        obj["parameters"] = parameters
    return orjson.dumps(obj)


async def assert_rest_serves(session: aiohttp.ClientSession, gw: InProcessGateway) -> None:
    status, reply = await post_json(session, base(gw, "rest") + IDENTITY, identity_json(("FP32", [2], [1.5, 2.5])))
    assert status == 200 and reply["outputs"][0]["data"] == [1.5, 2.5]


def grpc_request(*inputs: tuple[str, list[int], bytes], model: str = "identity") -> Any:
    request = pb.ModelInferRequest(model_name=model)
    for i, (datatype, shape, raw) in enumerate(inputs):
        request.inputs.add(name=f"INPUT{i}", datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    return request


def grpc_infer(channel: grpc.aio.Channel) -> Any:
    return channel.unary_unary(pb.method_path("ModelInfer"), request_serializer=pb.ModelInferRequest.SerializeToString,
                               response_deserializer=pb.ModelInferResponse.FromString)


async def grpc_error(channel: grpc.aio.Channel, request: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await grpc_infer(channel)(request, timeout=10, **kwargs)
    return info.value.code(), info.value.details() or ""


async def assert_grpc_serves(channel: grpc.aio.Channel) -> None:
    reply = await grpc_infer(channel)(grpc_request(("UINT8", [3], b"\1\2\3")), timeout=10)
    assert reply.raw_output_contents[0] == b"\1\2\3"


# --- tensors per request -----------------------------------------------------------


async def test_request_wide_elements_and_bytes(gateway: InProcessGateway) -> None:
    async with aiohttp.ClientSession() as session:
        url = base(gateway, "rest") + IDENTITY
        # Each tensor is under every per-tensor bound; together they pass the request's.
        # The first tensor's data is even wrong: the totals are checked from the
        # shapes before any data is read.
        body = identity_json(("INT8", [600], [1]), ("INT8", [600], [0] * 600))
        status, reply = await post_json(session, url, body)
        assert (status, set(reply)) == (413, {"error"}) and "limits.max_request_elements (1000)" in reply["error"]
        status, reply = await post_json(session, url, identity_json(("FP64", [400], [0.5] * 400),
                                                                    ("FP64", [400], [0.5] * 400)))
        assert status == 413 and "limits.max_request_tensor_bytes (6000)" in reply["error"]
        await assert_rest_serves(session, gateway)
    async with grpc.aio.insecure_channel(gateway.url("grpc")[7:]) as channel:
        code, details = await grpc_error(channel, grpc_request(("INT8", [600], b"\0"), ("INT8", [600], b"\0" * 600)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_request_elements" in details
        code, details = await grpc_error(channel, grpc_request(("FP64", [400], b"\0" * 3200),
                                                               ("FP64", [400], b"\0" * 3200)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_request_tensor_bytes" in details
        await assert_grpc_serves(channel)


async def test_bytes_element_size(gateway: InProcessGateway) -> None:
    big = b"x" * (BYTES_ELEMENT + 1)
    async with aiohttp.ClientSession() as session:
        url = base(gateway, "rest") + IDENTITY
        status, reply = await post_json(session, url, identity_json(("BYTES", [2], ["ok", big.decode()])))
        assert status == 413 and "limits.max_bytes_element (64)" in reply["error"]
        raw = struct.pack("<I", 2) + b"ok" + struct.pack("<I", len(big)) + big
        head = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [2],
                                         "parameters": {"binary_data_size": len(raw)}}]})
        status, reply = await post_json(session, url, head + raw, {"Inference-Header-Content-Length": str(len(head))})
        assert status == 413 and "a BYTES element of 65 bytes" in reply["error"]
        ok = b"y" * BYTES_ELEMENT  # at the limit: served
        status, reply = await post_json(session, url, identity_json(("BYTES", [1], [ok.decode()])))
        assert status == 200 and reply["outputs"][0]["data"] == [ok.decode()]
    async with grpc.aio.insecure_channel(gateway.url("grpc")[7:]) as channel:
        code, details = await grpc_error(channel, grpc_request(("BYTES", [1], struct.pack("<I", len(big)) + big)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_bytes_element" in details
        typed = pb.ModelInferRequest(model_name="identity")
        typed.inputs.add(name="INPUT0", datatype="BYTES", shape=[1]).contents.bytes_contents.append(big)
        code, details = await grpc_error(channel, typed)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_bytes_element" in details
        await assert_grpc_serves(channel)


# --- JSON nesting ----------------------------------------------------------------------


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return {"deep": value}


@pytest.mark.parametrize("depth", [DEPTH + 1, 300, 1100])  # ours; past orjson's writer (254); past its reader (1024)
async def test_json_nesting(gateway: InProcessGateway, depth: int) -> None:
    deep = b'{"deep":' + b"[" * (depth - 1) + b"1" + b"]" * (depth - 1) + b"}"
    async with aiohttp.ClientSession() as session:
        body = b'{"parameters": ' + deep + b', "inputs": []}'
        status, reply = await post_json(session, base(gateway, "rest") + IDENTITY, body)
        assert status == 400 and "over limits.max_json_depth (16)" in reply["error"], reply
        body = b'{"name": "forward", "input": [[1, 2], [3]], "config": ' + deep + b"}"
        status, reply = await post_json(session, base(gateway, "umb") + "/Evaluate", body)
        assert (status, reply["error"]["type"]) == (400, "InvalidInput")
        assert "max_json_depth" in reply["error"]["message"]
        body = b'{"gml_task": "node_classification", "graph": ' + deep + b"}"
        status, reply = await post_json(session, base(gateway, "gs") + "/invocations", body)
        assert status == 200 and (reply["status_code"], reply["request_uid"]) == (400, "")
        assert "max_json_depth" in reply["error"]
        # at the limit: served
        body = orjson.dumps({"parameters": nested(DEPTH - 1), "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1]}]})
        status, reply = await post_json(session, base(gateway, "rest") + IDENTITY, body)
        assert status == 200, reply


# --- headers -------------------------------------------------------------------------


async def _raw_exchange(port: int, request: bytes, read_timeout: float = 5.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(read_timeout):
            return await reader.read()  # until the gateway closes
    finally:
        writer.close()


def _split(reply: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, orjson.loads(body)


@pytest.mark.parametrize(("listener", "path"), [("rest", "/v2/health/live"), ("umb", "/Evaluate"), ("gs", "/ping")])
@pytest.mark.parametrize("shape", ["long header", "many headers", "long request line", "garbage"])
async def test_header_limits_answer_in_protocol_form(gateway: InProcessGateway, listener: str, path: str,
                                                     shape: str) -> None:
    port = gateway.gateway.ports[listener]
    headers = "Host: x\r\n"
    target = path
    if shape == "long header":
        headers += "X-Big: " + "a" * 2000 + "\r\n"
    elif shape == "many headers":
        headers += "".join(f"X-{i}: v\r\n" for i in range(30))
    elif shape == "long request line":
        target = path + "?" + "q" * 2000
    request = f"GET {target} HTTP/1.1\r\n{headers}\r\n".encode()
    if shape == "garbage":
        request = b"\x16\x03\x01\x02\x00 not http at all\r\n\r\n"
    started = time.monotonic()
    status, reply_headers, body = _split(await _raw_exchange(port, request))
    assert time.monotonic() - started < TIMEOUT / 2  # closed after the answer, not by the idle timeout
    expected = 400 if shape == "garbage" else 431
    assert status == expected
    assert reply_headers["content-type"].startswith("application/json")
    if listener == "rest":
        assert set(body) == {"error"}
    elif listener == "umb":
        assert body["error"]["type"] == "InvalidInput"
    else:
        assert body["status_code"] == 400 and body["data"] == {}
    if shape != "garbage":
        assert "max_header_line_bytes" in str(body)
    async with aiohttp.ClientSession() as session:  # still serving
        if listener == "umb":
            status, _ = await post_json(session, base(gateway, "umb") + path, orjson.dumps(GOOD_UMBRIDGE))
        else:
            async with session.get(base(gateway, listener) + path) as response:
                status = response.status
        assert status == 200


async def test_grpc_metadata_limit(gateway: InProcessGateway) -> None:
    async with grpc.aio.insecure_channel(gateway.url("grpc")[7:]) as channel:
        code, _ = await grpc_error(channel, grpc_request(("UINT8", [1], b"\1")),
                                   metadata=(("x-big", "a" * 4096),))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        await assert_grpc_serves(channel)


# --- slow clients -----------------------------------------------------------------


@pytest.mark.parametrize(("listener", "path"), [("rest", IDENTITY), ("umb", "/Evaluate"), ("gs", "/invocations")])
async def test_slow_body_gets_408_and_the_connection_closes(gateway: InProcessGateway, listener: str,
                                                            path: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.gateway.ports[listener])
    started = time.monotonic()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Content-Length: 1000\r\n\r\n{\"inputs\":".encode())
    await writer.drain()
    async with asyncio.timeout(5):
        reply = await reader.read()  # the gateway answers, then closes
    writer.close()
    elapsed = time.monotonic() - started
    status, _, body = _split(reply)
    if listener == "gs":  # GraphStorm: HTTP 200, the code in the envelope
        assert (status, body["status_code"]) == (200, 400)
    else:
        assert status == 408
    assert "limits.body_timeout" in str(body)
    assert TIMEOUT * 0.9 <= elapsed < 2 * TIMEOUT + 1  # the answer, then at most body_timeout of lingering


@pytest.mark.parametrize("listener", ["rest", "umb", "gs", "grpc"])
async def test_slow_or_silent_connections_are_closed(gateway: InProcessGateway, listener: str) -> None:
    """A client that never completes a request head (or an HTTP/2 preface)
    loses its connection after idle_timeout."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.gateway.ports[listener])
    started = time.monotonic()
    if listener != "grpc":
        writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        await writer.drain()
    async with asyncio.timeout(TIMEOUT + 10):
        while True:
            await asyncio.sleep(0.2)
            if listener != "grpc":
                writer.write(b"a")  # a byte now and then, never the end of the head
            if not await _still_open(reader):
                break
    writer.close()
    assert time.monotonic() - started < TIMEOUT + 10


async def _still_open(reader: asyncio.StreamReader) -> bool:
    try:
        async with asyncio.timeout(0.05):
            data = await reader.read(65536)
    except TimeoutError:
        return True
    except ConnectionResetError:  # closed while our last byte was in flight
        return False
    return bool(data) and not reader.at_eof()


# --- connections and concurrency ------------------------------------------------------


async def test_connections_that_never_sent_a_request_make_room(gateway: InProcessGateway) -> None:
    """At max_connections an idle connection (here: one that never sent a
    request) is closed, the oldest first, to admit a new one. Connections
    with requests in progress get the overloaded answer instead: see
    tests/test_availability_connections.py."""
    port = gateway.gateway.ports["rest"]
    guard = gateway.gateway.frontends["rest"].guard  # type: ignore[attr-defined]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(CONNECTIONS)]
    try:
        await _until(lambda: guard.connections == CONNECTIONS)
        async with aiohttp.ClientSession() as session:
            await assert_rest_serves(session, gateway)
        idle[0].settimeout(5)
        assert idle[0].recv(1) == b""  # the oldest, closed
        assert guard.connections <= CONNECTIONS
    finally:
        for sock in idle:
            sock.close()


async def test_grpc_connections_past_the_limit_are_closed(gateway: InProcessGateway) -> None:
    target = gateway.url("grpc")[7:]
    options = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(CONNECTIONS)]
    try:
        for channel in channels:
            await assert_grpc_serves(channel)
        async with grpc.aio.insecure_channel(target, options=options) as extra:
            code, _ = await grpc_error(extra, grpc_request(("UINT8", [1], b"\1")))
            assert code == grpc.StatusCode.UNAVAILABLE
    finally:
        for channel in channels:
            await channel.close()
    await asyncio.sleep(0.2)
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        await assert_grpc_serves(channel)


async def test_concurrent_requests_past_the_limit_are_refused_at_once(gateway: InProcessGateway) -> None:
    slow = identity_json(("FP32", [1], [1.0]))
    async with aiohttp.ClientSession() as session:
        rest = base(gateway, "rest")
        hung = [asyncio.create_task(session.post(rest + "/v2/models/slow/infer", data=slow)) for _ in range(REQUESTS)]
        await _until(lambda: gateway.gateway.frontends["rest"].cycle.requests == REQUESTS)  # type: ignore[attr-defined]
        status, reply = await post_json(session, rest + IDENTITY, slow)
        assert status == 429 and "limits.max_concurrent_requests" in reply["error"]
        async with session.get(rest + "/v2/health/ready") as probe:
            assert probe.status == 200  # probes are answered even when busy
        # Other listeners have their own budget; each answers in its own form when full.
        umb, gs = base(gateway, "umb"), base(gateway, "gs")
        hung += [asyncio.create_task(session.post(umb + "/Evaluate", data=orjson.dumps({"name": "slow", "input": []})))
                 for _ in range(REQUESTS)]
        hung += [asyncio.create_task(session.post(gs + "/invocations", data=orjson.dumps(movielens()), headers={
            **JSON, "X-Amzn-SageMaker-Target-Model": "gnn-slow"})) for _ in range(REQUESTS)]
        await _until(lambda: all(gateway.gateway.frontends[n].cycle.requests == REQUESTS  # type: ignore[attr-defined]
                                 for n in ("umb", "gs")))
        status, reply = await post_json(session, umb + "/Evaluate", orjson.dumps(GOOD_UMBRIDGE))
        assert (status, reply["error"]["type"]) == (429, "Overloaded")
        status, reply = await post_json(session, gs + "/invocations", b"{}")
        assert (status, reply["status_code"]) == (429, 500) and "max_concurrent_requests" in reply["error"]
        # Refused at once: answered while every slot is still held by a hung request.
        assert all(gateway.gateway.frontends[n].cycle.requests == REQUESTS  # type: ignore[attr-defined]
                   for n in ("rest", "umb", "gs"))
        async with grpc.aio.insecure_channel(gateway.url("grpc")[7:]) as channel:
            async def slow_call() -> Any:
                return await grpc_infer(channel)(grpc_request(("FP32", [1], b"\0" * 4), model="slow"), timeout=30)

            calls = [asyncio.create_task(slow_call()) for _ in range(REQUESTS)]
            await _until(lambda: gateway.gateway.frontends["grpc"].cycle.requests == REQUESTS)  # type: ignore[attr-defined]
            code, details = await grpc_error(channel, grpc_request(("UINT8", [1], b"\1")))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_concurrent_requests" in details
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            await _until(lambda: gateway.gateway.frontends["grpc"].cycle.requests == 0)  # type: ignore[attr-defined]
            await assert_grpc_serves(channel)
        for task in hung:
            task.cancel()
        await asyncio.gather(*hung, return_exceptions=True)
    # Slots free up when the upstream calls end (aiohttp lets a handler run
    # on after its client leaves); fresh clients are served again.
    await _until(lambda: all(gateway.gateway.frontends[n].cycle.requests == 0  # type: ignore[attr-defined]
                             for n in ("rest", "umb", "gs")))
    async with aiohttp.ClientSession() as session:
        await assert_rest_serves(session, gateway)
        status, reply = await post_json(session, base(gateway, "umb") + "/Evaluate", orjson.dumps(GOOD_UMBRIDGE))
        assert status == 200, reply


async def _until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def test_deep_bytes_data_decodes_without_recursion() -> None:
    """Nested BYTES data is flattened without recursion: a depth near
    orjson's own bound (1024) once raised RecursionError, a 500."""
    from gateway.protocols.v2_rest import codec

    body = (b'{"inputs": [{"name": "a", "datatype": "BYTES", "shape": [1], "data": ' + b"[" * 1000 + b'"x"'
            + b"]" * 1000 + b"}]}")
    (decoded,) = codec.decode_infer_request(body, None, "m", "", 10).inputs
    assert list(decoded.data) == [b"x"]


def test_limits_config_defaults_and_problems() -> None:
    from gateway.app.configure import parse_config
    from gateway.config.limits import Limits
    from gateway.config.node import ConfigError

    base = {"listeners": [], "upstreams": [], "routes": []}
    limits = parse_config({**base, "limits": {"max_bytes_element": "2KiB", "body_timeout": "500ms"}}).limits
    assert (limits.max_bytes_element, limits.body_timeout) == (2048, 0.5)
    assert limits.max_concurrent_requests == Limits().max_concurrent_requests == 256
    with pytest.raises(ConfigError) as info:
        parse_config({**base, "limits": {"max_json_depth": 300, "idle_timeout": 0, "max_connections": 0,
                                         "max_header_line_bytes": 10, "max_headrs": 5}})
    assert set(info.value.problems) == {
        "limits.max_json_depth: must be at most 254 (deeper JSON cannot be written back)",
        "limits.idle_timeout: must be more than 0",
        "limits.max_connections: must be at least 1, got 0",
        "limits.max_header_line_bytes: must be at least 256",
        "limits.max_headrs: unknown key",
    }
