"""The response cache's ``backend: redis`` with two real gateway processes
and a real redis-server: an answer one gateway got is a hit on the other
(the upstream called once in all), in whatever protocol each client speaks;
other inputs are a miss; entries expire after ttl (Redis's PX); a value in
Redis that is no entry for its key (corrupt, copied from another key, not
a string) is a miss answered correctly, counted; Redis hung or stopped
leaves every request answered (misses), counted and logged; an answer
larger than max_bytes is never stored; and the backend alone gives back
every byte it charged to the memory budget, a cancelled store too."""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from gateway.config.node import ConfigError
from gateway.runtime.redis import encode_command, parse_reply
from peers.redis_server import RedisServer
from support import GatewayProcess, metric_value, parse_yaml_config, scrape_metrics, wait_for, write_config

SHORT_TTL = 0.5
PREFIX = "gateway:response_cache:"


def config(redis_address: str, timeout: str = "5s") -> str:
    # A timeout no busy test machine reaches where a test needs every call to reach Redis.
    return f"""
admin: {{address: "127.0.0.1:0"}}
server:
  extensions: [classification, model_configuration, model_repository, statistics]
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams: [{{name: local, protocol: builtin}}]
redis: {{address: "{redis_address}", timeout: {timeout}}}
policies:
  - {{name: shared, response_cache: {{ttl: 60s, backend: redis}}}}
  - {{name: short, response_cache: {{ttl: {SHORT_TTL}, backend: redis}}}}
  - {{name: tiny, response_cache: {{max_bytes: 64, backend: redis}}}}
  - {{name: big, response_cache: {{max_bytes: 8MiB, backend: redis}}}}
routes:
  - {{name: short, match: {{model: simple, headers: {{x-cache: short}}}}, upstream: local, policies: [short]}}
  - {{name: tiny, match: {{model: simple, headers: {{x-cache: tiny}}}}, upstream: local, policies: [tiny]}}
  - {{name: big, match: {{model: identity, headers: {{x-cache: big}}}}, upstream: local, policies: [big]}}
  - {{name: cached, match: {{model: "*"}}, upstream: local, policies: [shared]}}
"""


def redis_call(server: RedisServer, *args: Any) -> Any:
    """One command to ``server`` over a socket of its own."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(encode_command(args))
        buffer = b""
        while True:
            chunk = sock.recv(1 << 16)
            assert chunk, "redis-server closed the connection"
            buffer += chunk
            try:
                return parse_reply(buffer, 0)[0]
            except Exception as exc:  # incomplete: read on
                if type(exc).__name__ != "_Incomplete":
                    raise


def cache_keys(server: RedisServer, policy: str) -> list[bytes]:
    return sorted(redis_call(server, "KEYS", f"{PREFIX}{policy}:*"))


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def gateways(redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, ...]]:
    directory = tmp_path_factory.mktemp("response_cache_redis")
    text = config(redis.address)
    with GatewayProcess(write_config(directory, text, "a.yaml"), directory / "a.log") as a, \
            GatewayProcess(write_config(directory, text, "b.yaml"), directory / "b.log") as b:
        yield a, b


_values = itertools.count(5000)


def _fresh() -> np.ndarray:
    """Input data no other test sends (a key of its own)."""
    return np.full((1, 16), next(_values), dtype=np.int32) + np.arange(16, dtype=np.int32)


def ask(gw: GatewayProcess, kind: str, a: np.ndarray, headers: dict[str, str] | None = None,
        request_id: str = "") -> Any:
    """`simple` with INPUT0 = INPUT1 = ``a``; the answer as tritonclient reads it."""
    module: Any = httpclient if kind == "rest" else grpcclient
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        item = module.InferInput(name, [1, 16], "INT32")
        item.set_data_from_numpy(a)
        inputs.append(item)
    with module.InferenceServerClient(gw.url(kind)) as client:
        return client.infer("simple", inputs, headers=headers, request_id=request_id)


def check(answer: Any, a: np.ndarray) -> None:
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), a + a)
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT1"), a - a)


class Counts:
    """Over both gateways, since it was made: upstream calls, and per
    gateway (hits, misses) and the redis backend's errors."""

    def __init__(self, *gws: GatewayProcess) -> None:
        self.gws = gws
        self.start = [self._now(gw) for gw in gws]

    @staticmethod
    def _now(gw: GatewayProcess) -> tuple[float, ...]:
        samples = scrape_metrics(gw)
        return (metric_value(samples, "gateway_upstream_requests_total", upstream="local"),
                *(metric_value(samples, "gateway_cache_requests_total", result=r) for r in ("hit", "miss")),
                *(metric_value(samples, "gateway_cache_redis_errors_total", error=e)
                  for e in ("unavailable", "invalid")))

    def delta(self) -> list[tuple[int, ...]]:
        """Per gateway: (upstream calls, hits, misses, unavailable, invalid)."""
        return [tuple(int(n - s) for n, s in zip(self._now(gw), start, strict=True))
                for gw, start in zip(self.gws, self.start, strict=True)]

    def upstream_calls(self) -> int:
        return sum(d[0] for d in self.delta())


def _statistics(gw: GatewayProcess) -> tuple[int, int]:
    """(cache hits, cache misses) of `simple` in Triton's statistics."""
    with httpclient.InferenceServerClient(gw.url("rest")) as client:
        entries = client.get_inference_statistics("simple")["model_stats"]
    return (sum(e["inference_stats"]["cache_hit"]["count"] for e in entries),
            sum(e["inference_stats"]["cache_miss"]["count"] for e in entries))


def test_an_answer_one_gateway_got_is_a_hit_on_the_other(gateways: tuple[GatewayProcess, ...]) -> None:
    a_gw, b_gw = gateways
    a = _fresh()
    stats = [_statistics(gw) for gw in gateways]
    counts = Counts(a_gw, b_gw)
    first = ask(a_gw, "rest", a, request_id="first")
    second = ask(b_gw, "grpc", a, request_id="second")  # the other gateway, another protocol
    third = ask(b_gw, "rest", a)
    assert counts.delta() == [(1, 0, 1, 0, 0), (0, 2, 0, 0, 0)]
    for answer in (first, second, third):
        check(answer, a)
    assert first.get_response()["id"] == "first" and second.get_response().id == "second"
    after = [_statistics(gw) for gw in gateways]
    assert [(h - h0, m - m0) for (h, m), (h0, m0) in zip(after, stats, strict=True)] == [(0, 1), (2, 0)]


def test_other_inputs_are_a_miss(gateways: tuple[GatewayProcess, ...]) -> None:
    a_gw, b_gw = gateways
    a = _fresh()
    other = a.copy()
    other.reshape(-1).view(np.uint8)[3] ^= 1  # one byte of one element
    counts = Counts(a_gw, b_gw)
    check(ask(a_gw, "grpc", a), a)
    check(ask(b_gw, "grpc", other), other)
    assert counts.upstream_calls() == 2
    check(ask(b_gw, "grpc", a), a)  # the first is kept all the same
    assert counts.delta() == [(1, 0, 1, 0, 0), (1, 1, 1, 0, 0)]


def test_an_entry_expires_after_ttl(redis: RedisServer, gateways: tuple[GatewayProcess, ...]) -> None:
    a_gw, b_gw = gateways
    a = _fresh()
    headers = {"x-cache": "short"}
    stored = time.monotonic()
    ask(a_gw, "rest", a, headers)
    counts = Counts(a_gw, b_gw)
    (key,) = cache_keys(redis, "short")
    assert 0 < redis_call(redis, "PTTL", key) <= SHORT_TTL * 1000  # the policy's ttl, as Redis's expiry
    check(ask(b_gw, "rest", a, headers), a)
    assert counts.upstream_calls() == 0

    def expired() -> bool:
        check(ask(b_gw, "rest", a, headers), a)
        return counts.upstream_calls() == 1

    wait_for(expired, 10, "the entry to expire", interval=0.1)
    assert time.monotonic() - stored >= SHORT_TTL  # never before its time


def test_a_value_that_is_no_entry_for_its_key_is_a_miss(redis: RedisServer,
                                                        gateways: tuple[GatewayProcess, ...]) -> None:
    a_gw, b_gw = gateways
    first, second = _fresh(), _fresh()
    for value in (first, second):
        ask(a_gw, "rest", value)
    before = set(cache_keys(redis, "shared"))
    third = _fresh()
    ask(a_gw, "rest", third)
    (key,) = set(cache_keys(redis, "shared")) - before
    entry = redis_call(redis, "GET", key)
    other_key = next(iter(before))
    flipped = bytearray(entry)
    flipped[len(flipped) // 2] ^= 0x10
    plants = [
        entry[:-1],  # cut
        bytes(flipped),  # changed
        redis_call(redis, "GET", other_key),  # a valid entry, of another key
        b"\x80\x04\x95 not ours",  # foreign
    ]
    for plant in plants:
        redis_call(redis, "SET", key, plant, "PX", 60000)
        counts = Counts(b_gw)
        check(ask(b_gw, "grpc", third), third)  # answered by the upstream, and stored again
        assert counts.delta() == [(1, 0, 1, 0, 1)], plant[:16]
        assert redis_call(redis, "GET", key) == entry  # the miss's answer replaced the bad value
    redis_call(redis, "DEL", key)
    redis_call(redis, "RPUSH", key, "not a string")
    counts = Counts(b_gw)
    check(ask(b_gw, "rest", third), third)
    assert counts.delta() == [(1, 0, 1, 0, 1)]
    wait_for(lambda: "read a value that is no entry" in b_gw.log(), 10, "the log line")


def test_an_answer_larger_than_max_bytes_is_never_stored(redis: RedisServer,
                                                         gateways: tuple[GatewayProcess, ...]) -> None:
    a_gw, _ = gateways
    a = _fresh()
    counts = Counts(a_gw)
    for _ in range(2):
        check(ask(a_gw, "rest", a, {"x-cache": "tiny"}), a)
    assert counts.delta() == [(2, 0, 2, 0, 0)]
    assert cache_keys(redis, "tiny") == []


@pytest.mark.parametrize("datatype", ["FP32", "BYTES"])
def test_a_big_answer_is_shared_whole(gateways: tuple[GatewayProcess, ...], datatype: str) -> None:
    """4 MiB (FP32) and 65,536 BYTES elements: checked, decoded and built off the loop."""
    a_gw, b_gw = gateways
    rng = np.random.default_rng(next(_values))
    if datatype == "FP32":
        data = rng.random((1, 1 << 20), dtype=np.float32)
    else:
        data = np.array([b"%d-%d" % (i, rng.integers(1 << 30)) for i in range(1 << 16)], dtype=object)
    counts = Counts(a_gw, b_gw)
    answers = []
    for gw in gateways:
        item = grpcclient.InferInput("INPUT0", list(data.shape), datatype)
        item.set_data_from_numpy(data)
        with grpcclient.InferenceServerClient(gw.url("grpc")) as client:
            answers.append(client.infer("identity", [item], headers={"x-cache": "big"}).as_numpy("OUTPUT0"))
    assert [d[:3] for d in counts.delta()] == [(1, 0, 1), (0, 1, 0)]
    for answer in answers:
        np.testing.assert_array_equal(answer, data)


def test_redis_stopped_leaves_every_request_answered(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server, \
            GatewayProcess(write_config(tmp_path, config(server.address, timeout="50ms")), tmp_path / "gw.log") as gw:
        a = _fresh()

        def stored() -> bool:  # the first look-ups may come before the connection to Redis
            check(ask(gw, "rest", a), a)
            return bool(cache_keys(server, "shared"))

        wait_for(stored, 15, "an entry stored")
        counts = Counts(gw)
        check(ask(gw, "rest", a), a)
        assert counts.delta() == [(0, 1, 0, 0, 0)]  # a hit: Redis is in use

        server.pause()  # connected, never answering: each look-up waits redis.timeout, then a miss
        try:
            counts = Counts(gw)
            for _ in range(3):
                started = time.monotonic()
                check(ask(gw, "grpc", a), a)
                assert time.monotonic() - started < 1.0
            assert counts.delta() == [(3, 0, 3, 3, 0)]
        finally:
            server.resume()

        server.stop()
        counts = Counts(gw)
        for kind in ("rest", "grpc"):
            for _ in range(3):
                started = time.monotonic()
                check(ask(gw, kind, a), a)
                assert time.monotonic() - started < 1.0
        calls, hits, misses, unavailable, invalid = counts.delta()[0]
        assert (calls, hits, misses, invalid) == (6, 0, 6, 0)
        assert unavailable == 6  # each look-up; a failed look-up stores nothing
        wait_for(lambda: "could not look up an answer in Redis" in gw.log(), 10, "the log line about Redis")


@pytest.mark.parametrize(("options", "redis", "problem"), [
    ("{backend: redis}", "", "policies: policy 'cache' needs Redis"),
    ("{backend: redis, max_bytes: 17MiB}", 'redis: {address: "127.0.0.1:6390"}',
     "policies[0].response_cache.max_bytes: must be at most 16MiB with backend: redis"),
    ("{backend: disk}", "", "policies[0].response_cache.backend: must be one of memory, redis"),
])
def test_bad_options_are_config_errors(options: str, redis: str, problem: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_yaml_config(_policy_config(options, redis))
    assert any(p.startswith(problem) for p in error.value.problems), error.value.problems


def _policy_config(options: str, redis: str = "") -> str:
    return f"""
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams: [{{name: local, protocol: builtin}}]
{redis}
policies: [{{name: cache, response_cache: {options}}}]
routes: [{{match: {{model: "*"}}, upstream: local, policies: [cache]}}]
"""


def test_the_redis_backend_takes_one_entrys_bound() -> None:
    options = parse_yaml_config(_policy_config("{backend: redis}", 'redis: {address: "127.0.0.1:6390"}')
                                ).policies[0].options
    assert (options.backend, options.max_bytes, options.uses_redis) == ("redis", 1 << 20, True)


# --- the backend alone, against the real redis-server: its memory charges ----------------------


class _Count:
    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: float = 1) -> None:
        self.value += int(amount)


def _backend(server: RedisServer, budget_bytes: int, clients: list[Any]) -> tuple[Any, Any, Any]:
    from gateway.config.redis import RedisConfig
    from gateway.dataplane.filters.cache_redis import RedisBackend
    from gateway.runtime.budget import InflightBudget
    from gateway.runtime.offload import Offloader
    from gateway.runtime.redis import RedisClient

    budget = InflightBudget(budget_bytes)
    client = RedisClient(RedisConfig(server.address, 5.0))
    clients.append(client)
    errors = (_Count(), _Count())
    return RedisBackend("unit", 60.0, 1 << 20, client, budget, Offloader(), errors), budget, errors


def _answer(values: np.ndarray) -> Any:
    from gateway.core.types import InferResponse, Tensor

    return InferResponse("simple", "1", "x", [Tensor.from_numpy("OUTPUT0", values)])


def test_the_backend_charges_what_it_holds_and_gives_it_all_back(redis: RedisServer) -> None:
    import asyncio

    async def run() -> None:
        clients: list[Any] = []
        try:
            await check_charges(clients)
        finally:
            for client in clients:
                await client.close()

    async def check_charges(clients: list[Any]) -> None:
        backend, budget, errors = _backend(redis, 1 << 20, clients)
        key = uuid_key()
        assert await backend.put(key, _answer(np.arange(1000, dtype=np.int64)))
        assert budget.used == 0
        kept = await backend.get(key)
        assert kept is not None and budget.used == 0
        np.testing.assert_array_equal(kept[3][0][3], np.arange(1000))
        # Too big for the budget: a miss, and not stored; nothing held after.
        small, small_budget, _ = _backend(redis, 4096, clients)
        assert await small.get(key) is None and small_budget.used == 0
        other = uuid_key()
        assert not await small.put(other, _answer(np.arange(1000, dtype=np.int64)))
        assert small_budget.used == 0 and await backend.get(other) is None
        # A store cancelled while Redis does not answer gives back its charge.
        redis.pause()
        try:
            task = asyncio.ensure_future(backend.put(uuid_key(), _answer(np.arange(10, dtype=np.int64))))
            for _ in range(200):
                if budget.used:
                    break
                await asyncio.sleep(0.01)
            assert budget.used > 0
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert budget.used == 0
        finally:
            redis.resume()
        assert errors[0].value == errors[1].value == 0

    asyncio.run(run())


def uuid_key() -> bytes:
    import os

    return os.urandom(16)


@pytest.mark.parametrize("data", [np.array(["text", "not bytes"], dtype=object), np.array([1, 2])])
def test_an_answer_the_entry_cannot_carry_is_not_stored(data: np.ndarray) -> None:
    """BYTES data that is no bytes: answered all the same, never stored (no Redis call is made)."""
    import asyncio

    from gateway.core.types import InferResponse, Tensor
    from gateway.dataplane.filters.cache_redis import RedisBackend
    from gateway.runtime.budget import InflightBudget
    from gateway.runtime.offload import Offloader

    budget = InflightBudget(1 << 20)
    backend = RedisBackend("unit", 60.0, 1 << 20, None, budget, Offloader(), (_Count(), _Count()))  # type: ignore[arg-type]
    response = InferResponse("m", "", "", [Tensor("x", "BYTES", (2,), data)])
    assert asyncio.run(backend.put(bytes(16), response)) is False
    assert budget.used == 0
