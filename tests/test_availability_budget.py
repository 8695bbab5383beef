"""The memory budget (limits.max_inflight_bytes) and the JSON size bounds
over real sockets: one budget per worker, shared by every listener; past it
each protocol refuses at once in its own form; a request that can never fit
is 413; everything held is given back. Also Accept-Encoding q-values.

Slow uploads hold the budget: a body's declared length is charged before
it is read, so a client that sends its head and then nothing keeps its
share until it goes away.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import numpy as np
import orjson
import pytest

from gateway.protocols.v2_grpc import messages as pb
from support import InProcessGateway

BUDGET = 2 << 20
HELD = 900_000  # declared by each slow upload: two of them leave ~300 KB of the budget

CONFIG = f"""
admin: {{address: null}}
limits:
  max_request_bytes: 1MiB
  max_inflight_bytes: {BUDGET}
  max_json_containers: 1000
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
  - {{name: umb, protocol: umbridge, address: "127.0.0.1:0"}}
  - {{name: gs, protocol: graphstorm, address: "127.0.0.1:0", model: gnn}}
upstreams:
  - {{name: local, protocol: builtin}}
routes:
  - match: {{model: gnn, listener: gs}}
    upstream: local
    options: {{graphstorm: {{graph_schema: "builtin:movielens"}}}}
  - match: {{model: "*"}}
    upstream: local
"""

IDENTITY = "/v2/models/identity/infer"
JSON = {"Content-Type": "application/json"}


@pytest.fixture
async def gateway() -> AsyncIterator[InProcessGateway]:
    async with InProcessGateway(CONFIG) as gw:
        yield gw


def budget_used(gw: InProcessGateway) -> int:
    return gw.gateway.services.budget.used


def binary_identity(values: int) -> tuple[bytes, dict[str, str]]:
    head = orjson.dumps({"parameters": {"binary_data_output": True},
                         "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [values],
                                     "parameters": {"binary_data_size": values * 4}}]})
    return head + np.ones(values, np.float32).tobytes(), {"Content-Type": "application/octet-stream",
                                                          "Inference-Header-Content-Length": str(len(head))}


async def hold_budget(port: int, declared: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An upload that declares ``declared`` bytes and sends none of them."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST {IDENTITY} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {declared}\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


async def until(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_past_the_budget_every_protocol_refuses_at_once(gateway: InProcessGateway) -> None:
    holders = [await hold_budget(gateway.gateway.ports["rest"], HELD) for _ in range(2)]
    await until(lambda: budget_used(gateway) >= 2 * HELD)
    body, headers = binary_identity(100_000)  # 400 KB: more than is left
    async with aiohttp.ClientSession() as session:
        async with session.post(gateway.url("rest") + IDENTITY, data=body, headers=headers) as reply:
            assert reply.status == 503
            assert reply.headers["Retry-After"] == "1"
            assert "limits.max_inflight_bytes" in orjson.loads(await reply.read())["error"]
        # UM-Bridge: its own error form, the same status
        umbridge = orjson.dumps({"name": "forward", "input": [[1.0] * 40_000, [3.0]]})
        async with session.post(gateway.url("umb") + "/Evaluate", data=umbridge, headers=JSON) as reply:
            error = orjson.loads(await reply.read())["error"]
            assert reply.status == 503 and "max_inflight_bytes" in error["message"], error
        # health stays answered: it holds no body
        async with session.get(gateway.url("rest") + "/v2/health/ready") as reply:
            assert reply.status == 200
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.gateway.ports['grpc']}") as channel:
        call = channel.unary_unary(f"/{pb.SERVICE}/ModelInfer", request_serializer=pb.serializer(pb.ModelInferRequest),
                                   response_deserializer=pb.ModelInferResponse.FromString)
        request = pb.ModelInferRequest(model_name="identity")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[100_000])
        request.raw_input_contents.append(np.ones(100_000, np.float32).tobytes())
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(request, timeout=5)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_inflight_bytes" in (refused.value.details() or "")
        for _, writer in holders:  # the slow uploads go away: their share comes back
            writer.close()
        await until(lambda: budget_used(gateway) == 0)
        reply = await call(request, timeout=5)
        assert np.frombuffer(reply.raw_output_contents[0], np.float32).sum() == 100_000
    async with aiohttp.ClientSession() as session:
        async with session.post(gateway.url("rest") + IDENTITY, data=body, headers=headers) as reply:
            assert reply.status == 200
    assert budget_used(gateway) == 0


async def test_a_request_that_can_never_fit_is_too_large(gateway: InProcessGateway) -> None:
    # 160 K numbers in 600 KB of JSON: parsing them builds more than the whole budget
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [160_000],
                                     "data": [7] * 160_000}]})
    assert len(body) < 1 << 20
    async with aiohttp.ClientSession() as session, \
            session.post(gateway.url("rest") + IDENTITY, data=body, headers=JSON) as reply:
        assert reply.status == 413
        assert "max_inflight_bytes" in orjson.loads(await reply.read())["error"]
    assert budget_used(gateway) == 0


async def test_json_containers_are_bounded(gateway: InProcessGateway) -> None:
    # 70 KB of small nested lists: past max_json_containers (1000), refused before parsing
    rows = [[1, 2]] * 20_000
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [20_000, 2], "data": rows}]})
    async with aiohttp.ClientSession() as session:
        async with session.post(gateway.url("rest") + IDENTITY, data=body, headers=JSON) as reply:
            assert reply.status == 413
            assert "max_json_containers" in orjson.loads(await reply.read())["error"]
        flat = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [5_000, 2],
                                         "data": [1, 2] * 5_000}]})
        async with session.post(gateway.url("rest") + IDENTITY, data=flat, headers=JSON) as reply:
            assert reply.status == 200


@pytest.mark.parametrize(("accept", "coding"), [
    ("gzip", "gzip"), ("gzip;q=0", None), ("gzip;q=0, deflate", "deflate"), ("deflate, gzip;q=0.5", "deflate"),
    ("*;q=0", None), ("identity", None), ("br", None)])
async def test_answers_honour_accept_encoding_q_values(gateway: InProcessGateway, accept: str,
                                                       coding: str | None) -> None:
    body, headers = binary_identity(4096)
    request_headers = {**headers, "Accept-Encoding": accept}
    async with aiohttp.ClientSession(auto_decompress=False) as session, \
            session.post(gateway.url("rest") + IDENTITY, data=body, headers=request_headers) as reply:
        assert reply.status == 200
        assert reply.headers.get("Content-Encoding") == coding
        raw = await reply.read()
        if coding == "gzip":
            raw = gzip.decompress(raw)
        elif coding == "deflate":
            raw = zlib.decompress(raw)
        assert raw.endswith(np.ones(4096, np.float32).tobytes())
