"""Bad input over real sockets: each gets the V2 error form, status and a
clear message, and the gateway keeps serving afterwards."""

from __future__ import annotations

import gzip
import io
import struct
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from support import BUILTIN_REST_CONFIG, InProcessGateway

LIMIT = 1 << 20
CONFIG = BUILTIN_REST_CONFIG + f"limits: {{max_request_bytes: {LIMIT}}}\n"
SIMPLE = "/v2/models/simple/infer"
IDENTITY = "/v2/models/identity/infer"


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[InProcessGateway, aiohttp.ClientSession]]:
    async with InProcessGateway(CONFIG) as gw, aiohttp.ClientSession(gw.url()) as session:
        yield gw, session


async def _post(session: aiohttp.ClientSession, path: str, body: bytes,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    async with session.post(path, data=body, headers=headers or {}) as response:
        assert response.content_type == "application/json"
        return response.status, orjson.loads(await response.read())


def _identity_json(datatype: str, shape: Any, data: Any) -> bytes:
    return orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": shape, "data": data}]})


def _binary_body(head: dict[str, Any], tail: bytes) -> tuple[bytes, dict[str, str]]:
    head_bytes = orjson.dumps(head)
    return head_bytes + tail, {"Inference-Header-Content-Length": str(len(head_bytes))}


def _binary_input(datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": shape,
                        "parameters": {"binary_data_size": size}}]}


# Binary data cannot disagree with a shape before it is read: over the limit is 413.
_HUGE_BINARY_HEAD = (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1099511627776], '
                     b'"parameters": {"binary_data_size": 4}}]}')

# (name, path, body, headers, status, words expected in the message)
CASES: list[tuple[str, str, bytes, dict[str, str], int, str]] = [
    ("malformed json", SIMPLE, b'{"inputs": [', {}, 400, "not valid JSON"),
    ("body not an object", SIMPLE, b"[1, 2]", {}, 400, "must be a JSON object"),
    ("inputs not a list", SIMPLE, b'{"inputs": {"a": 1}}', {}, 400, "'inputs' must be a list"),
    ("name not a string", IDENTITY, b'{"inputs": [{"name": 5, "datatype": "FP32", "shape": [1], "data": [1]}]}',
     {}, 400, "'name' must be a string"),
    ("shape not a list", IDENTITY, _identity_json("FP32", "4", [1, 2, 3, 4]), {}, 400, "'shape' must be a list"),
    ("shape of floats", IDENTITY, _identity_json("FP32", [2.0], [1, 2]), {}, 400, "list of integers"),
    ("unknown datatype", IDENTITY, _identity_json("FLOAT32", [1], [1.0]), {}, 400, "unknown datatype 'FLOAT32'"),
    ("shape vs data mismatch", IDENTITY, _identity_json("FP32", [2, 3], [1, 2, 3, 4]), {}, 400,
     "has 4 data elements but shape [2, 3] needs 6"),
    ("huge declared shape", IDENTITY, _identity_json("FP32", [1 << 40], [1, 2, 3, 4]), {}, 400,
     "has 4 data elements but shape [1099511627776] needs 1099511627776"),
    ("huge nested shape", IDENTITY, _identity_json("FP32", [1 << 20, 1 << 20], [[1, 2], [3, 4]]), {}, 400,
     "has 4 data elements but shape [1048576, 1048576] needs 1099511627776"),
    ("huge shape, binary", IDENTITY, _HUGE_BINARY_HEAD + b"\0" * 4,
     {"Inference-Header-Content-Length": str(len(_HUGE_BINARY_HEAD))}, 413, "over the limit"),
    ("huge shape under limit", IDENTITY, _identity_json("INT8", [1 << 16, 1 << 10], [1, 2, 3, 4]), {}, 400,
     "has 4 data elements but shape [65536, 1024] needs 67108864"),
    ("negative dimension", IDENTITY, _identity_json("FP32", [-4], [1, 2, 3, 4]), {}, 400, "negative dimension"),
    ("ragged nested data", IDENTITY, _identity_json("FP32", [2, 2], [[1, 2], [3]]), {}, 400, "ragged"),
    ("strings as numbers", IDENTITY, _identity_json("FP32", [2], ["1", "2"]), {}, 400, "must be numbers"),
    ("int out of range", IDENTITY, _identity_json("INT8", [2], [1, 300]), {}, 400, "out of range for INT8"),
    ("float for int", IDENTITY, _identity_json("INT32", [2], [1.5, 2]), {}, 400, "must be integers"),
    ("numbers for bool", IDENTITY, _identity_json("BOOL", [2], [1, 0]), {}, 400, "true/false"),
    ("numbers for bytes", IDENTITY, _identity_json("BYTES", [2], [1, 2]), {}, 400, "must be strings"),
    ("no data", IDENTITY, b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1]}]}', {}, 400,
     "neither 'data' nor 'binary_data_size'"),
    ("header length beyond body", IDENTITY, b'{"inputs": []}', {"Inference-Header-Content-Length": "99"}, 400,
     "outside the body"),
    ("header length not a number", IDENTITY, b'{"inputs": []}', {"Inference-Header-Content-Length": "x"}, 400,
     "must be an integer"),
    ("binary size overruns body", IDENTITY, *_binary_body(_binary_input("FP32", [4], 16), b"\0" * 8), 400,
     "overruns the binary data"),
    ("binary size vs shape", IDENTITY, *_binary_body(_binary_input("FP32", [4], 8), b"\0" * 8), 400,
     "has 8 bytes of data but shape [4] of FP32 needs 16"),
    ("binary sizes leave bytes over", IDENTITY, *_binary_body(_binary_input("FP32", [2], 8), b"\0" * 12), 400,
     "4 bytes of binary data follow"),
    ("bytes prefix overruns", IDENTITY,
     *_binary_body(_binary_input("BYTES", [1], 8), struct.pack("<I", 100) + b"abcd"), 400,
     "length 100 overruns"),
    ("bytes prefix truncated", IDENTITY,
     *_binary_body(_binary_input("BYTES", [2], 7), struct.pack("<I", 1) + b"a" + b"\0\0"), 400,
     "ends inside a length prefix"),
    ("bytes count vs shape", IDENTITY,
     *_binary_body(_binary_input("BYTES", [2], 5), struct.pack("<I", 1) + b"a"), 400,
     "has 1 BYTES elements but shape [2] needs 2"),
    ("binary size negative", IDENTITY, *_binary_body(_binary_input("FP32", [1], -4), b""), 400,
     "non-negative integer"),
    ("unknown model", "/v2/models/nope/infer", _identity_json("FP32", [1], [1]), {}, 404, "model: 'nope' is not"),
    ("unknown version", "/v2/models/simple/versions/7/infer", _identity_json("FP32", [1], [1]), {}, 404,
     "version '7'"),
    # Behind the catch-all route to builtin models: the model is checked before the body.
    ("unknown model, broken body", "/v2/models/nope/infer", b"{not json", {}, 404, "model: 'nope' is not"),
    ("unknown version, broken body", "/v2/models/simple/versions/7/infer", b"{not json", {}, 404, "version '7'"),
    ("unsupported encoding", SIMPLE, b"xx", {"Content-Encoding": "br"}, 501, "Content-Encoding 'br'"),
    ("broken gzip", SIMPLE, b"not gzip at all", {"Content-Encoding": "gzip"}, 400, "not valid gzip"),
    ("missing input", SIMPLE, orjson.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}]}), {}, 400,
     "input 'INPUT1' is missing"),
    ("wrong datatype for model", SIMPLE, orjson.dumps({"inputs": [
        {"name": n, "datatype": "FP32", "shape": [1, 16], "data": list(range(16))} for n in ("INPUT0", "INPUT1")]}),
     {}, 400, "must be INT32, got FP32"),
    ("unknown requested output", IDENTITY, orjson.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1]}],
        "outputs": [{"name": "NOPE"}]}), {}, 400, "unexpected inference output 'NOPE'"),
]


@pytest.mark.parametrize(("path", "body", "headers", "status", "words"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
async def test_bad_input(gateway: tuple[InProcessGateway, aiohttp.ClientSession], path: str, body: bytes,
                         headers: dict[str, str], status: int, words: str) -> None:
    _, session = gateway
    got_status, reply = await _post(session, path, body, headers)
    assert got_status == status, reply
    assert set(reply) == {"error"}
    assert words in reply["error"]
    # ... and the gateway still serves a good request afterwards.
    ok_status, ok = await _post(session, IDENTITY, _identity_json("FP32", [2], [1.5, 2.5]))
    assert ok_status == 200 and ok["outputs"][0]["data"] == [1.5, 2.5]


async def test_body_over_limit_by_content_length(gateway: tuple[InProcessGateway, aiohttp.ClientSession]) -> None:
    _, session = gateway
    body = io.BytesIO(b" " * (LIMIT + 1))  # aiohttp warns on large raw bytes
    status, reply = await _post(session, IDENTITY, body)  # type: ignore[arg-type]
    assert status == 413 and "exceeds the limit of 1048576 bytes" in reply["error"]


async def test_body_over_limit_chunked(gateway: tuple[InProcessGateway, aiohttp.ClientSession]) -> None:
    _, session = gateway

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(LIMIT // 65536 + 2):
            yield b" " * 65536

    status, reply = await _post(session, IDENTITY, chunks())  # type: ignore[arg-type]
    assert status == 413 and "limit" in reply["error"]


async def test_gzip_bomb_is_refused(gateway: tuple[InProcessGateway, aiohttp.ClientSession]) -> None:
    _, session = gateway
    bomb = gzip.compress(b"\0" * (64 * LIMIT))  # ~64 KiB that inflates to 64 MiB
    assert len(bomb) < LIMIT
    status, reply = await _post(session, IDENTITY, bomb, {"Content-Encoding": "gzip"})
    assert status == 413 and "inflates to more than the limit" in reply["error"]


@pytest.mark.parametrize("count", [4, 4096])
async def test_responses_compressed_when_accepted_and_worth_it(
        gateway: tuple[InProcessGateway, aiohttp.ClientSession], count: int) -> None:
    _, session = gateway
    body = _identity_json("FP32", [count], [0.5] * count)
    async with session.post(IDENTITY, data=body, headers={"Accept-Encoding": "gzip"},
                            auto_decompress=False) as response:
        raw = await response.read()
        compressed = response.headers.get("Content-Encoding") == "gzip"
    assert compressed == (count == 4096)  # a tiny answer is not worth compressing
    reply = orjson.loads(gzip.decompress(raw) if compressed else raw)
    assert reply["outputs"][0]["data"] == [0.5] * count


async def test_unknown_path_and_method(gateway: tuple[InProcessGateway, aiohttp.ClientSession]) -> None:
    _, session = gateway
    async with session.get("/v2/nothing/here") as response:
        assert response.status == 404 and "error" in orjson.loads(await response.read())
    async with session.get(SIMPLE) as response:
        assert response.status == 405
        assert "not allowed" in orjson.loads(await response.read())["error"]


async def test_readiness_semantics(gateway: tuple[InProcessGateway, aiohttp.ClientSession]) -> None:
    gw, session = gateway
    async with session.get("/v2/models/simple/ready") as response:
        assert response.status == 200
    async with session.get("/v2/models/nope/ready") as response:
        assert response.status == 404
    gw.gateway.dataplane.draining = True
    async with session.get("/v2/health/ready") as response:
        assert response.status == 400
        assert "not ready" in orjson.loads(await response.read())["error"]
    async with session.get("/v2/health/live") as response:
        assert response.status == 200
