"""The rate_limit filter against real clients and a real redis-server:
a bucket's admissions are exact under a burst (a tiny requests_per_second,
so no token comes back during a test), a refusal is each protocol's own
overload form, other keys are unaffected, the global scope is one bucket
for two gateway processes, and a Redis that is down or hangs costs no
request more than the timeout: on_error decides, counted."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from gateway.app.configure import parse_config
from gateway.config.node import ConfigError
from peers.echo_gateway import admin_call
from peers.redis_server import RedisServer
from support import (
    SIMPLE_INFER_REQUEST,
    GatewayProcess,
    free_port,
    metric_value,
    scrape_metrics,
    wait_for,
    write_config,
)

BURST = 40
SLOW = 0.001  # requests per second: no token comes back within a test
REQUEST = json.dumps(SIMPLE_INFER_REQUEST).encode()
V1_REQUEST = json.dumps({"inputs": {"INPUT0": [list(range(16))], "INPUT1": [[1] * 16]}}).encode()


def config(policies: str, redis: str = "") -> str:
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
  - {{name: v1, protocol: v1-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin}}
{redis}
policies: {policies}
routes:
  - match: {{model: simple}}
    upstream: local
    policies: [limit]
  - match: {{model: "*"}}
    upstream: local
"""


def rest(gw: GatewayProcess, key: str, listener: str = "rest") -> tuple[int, dict[str, str], bytes, float]:
    """One inference of `simple` with ``x-api-key: key``: status, headers, body, seconds taken."""
    path, body = ("/v2/models/simple/infer", REQUEST) if listener == "rest" else ("/v1/models/simple:predict",
                                                                                    V1_REQUEST)
    request = urllib.request.Request(f"http://{gw.url(listener)}{path}", data=body,
                                     headers={"Content-Type": "application/json", "x-api-key": key})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read(), time.monotonic() - started
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read(), time.monotonic() - started


def burst(send: Any, count: int, threads: int = 16) -> list[Any]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda _: send(), range(count)))


# --- local --------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("rate-limit")
    policies = (f'[{{name: limit, rate_limit: {{requests_per_second: {SLOW}, burst: {BURST}, '
                f'key: "header:x-api-key"}}}}]')
    with GatewayProcess(write_config(directory, config(policies)), directory / "gateway.log") as gw:
        yield gw


def test_a_burst_at_one_key_gets_exactly_the_buckets_admissions(local_gateway: GatewayProcess) -> None:
    before = metric_value(scrape_metrics(local_gateway), "gateway_rate_limited_total", policy="limit")
    answers = burst(lambda: rest(local_gateway, "key-a"), 200)
    statuses = [status for status, *_ in answers]
    assert statuses.count(200) == BURST and statuses.count(429) == 200 - BURST, statuses
    for status, headers, body, _ in answers:
        if status == 429:
            # The wait for the next token: 1/rate seconds, less the moments the burst took.
            assert 1000 - 60 <= int(headers["Retry-After"]) <= 1000, headers
            assert json.loads(body) == {"error": "rate limit of policy 'limit' exceeded; retry in "
                                                 f"{headers['Retry-After']} s"}
    after = metric_value(scrape_metrics(local_gateway), "gateway_rate_limited_total", policy="limit")
    assert after - before == 200 - BURST
    # Another key has its own full bucket; a route without the policy is not limited.
    assert rest(local_gateway, "key-b")[0] == 200
    assert rest(local_gateway, "key-a")[0] == 429


def test_grpc_refusals_are_resource_exhausted(local_gateway: GatewayProcess) -> None:
    with grpcclient.InferenceServerClient(local_gateway.url("grpc")) as client:
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            item = grpcclient.InferInput(name, [1, 16], "INT32")
            item.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
            inputs.append(item)

        def send() -> str:
            try:
                client.infer("simple", inputs, headers={"x-api-key": "grpc-key"})
                return "ok"
            except InferenceServerException as error:
                assert "rate limit of policy 'limit' exceeded" in str(error), error
                return str(error.status())

        outcomes = burst(send, 100, threads=8)
    assert outcomes.count("ok") == BURST
    assert outcomes.count("StatusCode.RESOURCE_EXHAUSTED") == 100 - BURST, outcomes


def test_v1_refusals_are_429_with_retry_after(local_gateway: GatewayProcess) -> None:
    answers = [rest(local_gateway, "v1-key", "v1") for _ in range(BURST + 3)]
    assert [a[0] for a in answers] == [200] * BURST + [429] * 3, [a[2] for a in answers if a[0] != 429][-1:]
    _, headers, body, _ = answers[-1]
    assert int(headers["Retry-After"]) >= 1
    assert set(json.loads(body)) == {"error"}


def test_keys_combine_and_the_local_buckets_are_bounded(tmp_path: Path) -> None:
    """key: [header, model] gives each pair its own bucket; past max_keys the
    least recently admitted key is dropped and starts over with a full bucket."""
    policies = (f'[{{name: limit, rate_limit: {{requests_per_second: {SLOW}, burst: 1, max_keys: 8, '
                f'key: ["header:x-api-key", model]}}}}]')
    with GatewayProcess(write_config(tmp_path, config(policies)), tmp_path / "gateway.log") as gw:
        assert rest(gw, "first")[0] == 200
        assert rest(gw, "first")[0] == 429
        for index in range(8):  # eight newer keys: "first" is the least recently admitted
            assert rest(gw, f"other-{index}")[0] == 200
        assert rest(gw, "first")[0] == 200
        wait_for(lambda: "keys dropped before their bucket was full again" in gw.log(), 10, "the eviction's log line")


def test_local_buckets_are_charged_to_the_memory_budget(tmp_path: Path) -> None:
    """Keys are charged 256 at a time (768 bytes each, 192 KiB): with a 256 KiB
    budget the first 256 fit, the 257th is refused at once; known keys go on."""
    text = config(f'[{{name: limit, rate_limit: {{requests_per_second: {SLOW}, burst: 2, '
                  f'key: "header:x-api-key"}}}}]')
    text += "limits: {max_request_bytes: 16KiB, max_inflight_bytes: 256KiB}\n"
    with GatewayProcess(write_config(tmp_path, text), tmp_path / "gateway.log") as gw:
        assert [rest(gw, f"key-{i}")[0] for i in range(256)] == [200] * 256
        status, headers, body, _ = rest(gw, "one-too-many")
        assert (status, headers["Retry-After"]) == (503, "1"), body
        assert b"memory budget" in body
        assert rest(gw, "key-0")[0] == 200  # its bucket is kept and charged: the second token


def test_a_reload_keeps_a_policys_buckets_while_its_options_stay(tmp_path: Path) -> None:
    policy = '[{name: limit, rate_limit: {requests_per_second: 0.001, burst: BURST, key: "header:x-api-key"}}]'
    path = write_config(tmp_path, config(policy.replace("BURST", "2")))
    with GatewayProcess(path, tmp_path / "gateway.log") as gw:
        assert [rest(gw, "k")[0] for _ in range(3)] == [200, 200, 429]
        path.write_text(config(policy.replace("BURST", "2")) + "drain: {delay: 1s}\n")  # the policy unchanged
        assert admin_call(gw, "/reload", "POST")[0] == 200
        assert rest(gw, "k")[0] == 429  # the same buckets
        path.write_text(config(policy.replace("BURST", "3")))  # a new policy: new buckets
        assert admin_call(gw, "/reload", "POST")[0] == 200
        assert [rest(gw, "k")[0] for _ in range(4)] == [200, 200, 200, 429]
        path.write_text(config(policy.replace("BURST", "3"), 'redis: {address: "127.0.0.1:6379"}'))
        status, body = admin_call(gw, "/reload", "POST")
        assert status == 400 and body["problems"][0].startswith("redis: changed, which needs a restart")


# --- global ---------------------------------------------------------------------


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path) as server:
        yield server


def _global(address: str, on_error: str = "allow", burst_size: int = BURST, timeout: str = "50ms") -> str:
    return config(f'[{{name: limit, rate_limit: {{requests_per_second: {SLOW}, burst: {burst_size}, '
                  f'key: "header:x-api-key", scope: global}}}}]',
                  f'redis: {{address: "{address}", timeout: {timeout}, on_error: {on_error}}}')


def test_two_gateways_share_one_global_bucket(redis: RedisServer, tmp_path: Path) -> None:
    # A timeout no busy test machine reaches: here every request must be checked by Redis, none allowed unchecked.
    text = _global(redis.address, timeout="5s")
    with GatewayProcess(write_config(tmp_path, text, "a.yaml"), tmp_path / "a.log") as a, \
            GatewayProcess(write_config(tmp_path, text, "b.yaml"), tmp_path / "b.log") as b:
        assert rest(a, "warm")[0] == rest(b, "warm")[0] == 200  # each connected to Redis
        answers = burst(lambda: [rest(a, "shared")[0], rest(b, "shared")[0]], 60)
        per_gateway = [[pair[i] for pair in answers] for i in (0, 1)]
        admitted = [statuses.count(200) for statuses in per_gateway]
        assert sum(admitted) == BURST, admitted
        assert all(n > 0 for n in admitted), admitted  # both took from the one bucket
        assert sum(s.count(429) for s in per_gateway) == 120 - BURST
        assert rest(b, "another")[0] == 200
        for gw in (a, b):
            assert metric_value(scrape_metrics(gw), "gateway_rate_limit_redis_errors_total") == 0


def test_two_gateways_refill_one_global_bucket_at_its_rate(redis: RedisServer, tmp_path: Path) -> None:
    """Over ~3 s of steady pressure from both gateways, together they admit
    what one bucket allows: its burst plus the rate times the time taken (±10%)."""
    text = config('[{name: limit, rate_limit: {requests_per_second: 20, burst: 10, key: "header:x-api-key", '
                  'scope: global}}]', f'redis: {{address: "{redis.address}", timeout: 5s}}')
    with GatewayProcess(write_config(tmp_path, text, "a.yaml"), tmp_path / "a.log") as a, \
            GatewayProcess(write_config(tmp_path, text, "b.yaml"), tmp_path / "b.log") as b:
        assert rest(a, "warm")[0] == rest(b, "warm")[0] == 200
        started = time.monotonic()

        def press(gw: GatewayProcess) -> list[int]:
            statuses = []
            while time.monotonic() - started < 3.0:
                statuses.append(rest(gw, "steady")[0])
            return statuses

        with ThreadPoolExecutor(8) as pool:
            runs = list(pool.map(press, [a, b] * 4))
        elapsed = time.monotonic() - started
    statuses = [s for run in runs for s in run]
    assert set(statuses) == {200, 429}
    expected = 10 + 20 * elapsed
    assert abs(statuses.count(200) - expected) <= 0.1 * expected, (statuses.count(200), expected)
    assert all(run.count(200) > 0 for run in runs[:2])  # both gateways admitted some


def test_redis_down_or_hung_costs_no_more_than_the_timeout(redis: RedisServer, tmp_path: Path) -> None:
    with GatewayProcess(write_config(tmp_path, _global(redis.address, burst_size=2)), tmp_path / "gw.log") as gw:
        fresh = iter(range(1000))

        def limited() -> bool:
            """A new key's bucket holds exactly two: the limit is checked in Redis."""
            key = f"key-{next(fresh)}"  # a key no earlier try took tokens from
            return [rest(gw, key)[0] for _ in range(3)] == [200, 200, 429]

        wait_for(limited, 15, "the gateway to check its limit in Redis")  # connected (a slow first connect allows)
        before = metric_value(scrape_metrics(gw), "gateway_rate_limit_redis_errors_total", decision="allowed")

        redis.pause()  # connected, never answering
        try:
            hung = [rest(gw, "k") for _ in range(5)]
        finally:
            redis.resume()
        assert [a[0] for a in hung] == [200] * 5  # on_error: allow
        assert max(a[3] for a in hung) < 1.0, [a[3] for a in hung]  # each waited ~50 ms, not for Redis

        redis.stop()  # gone: connection refused, then retried with a backoff
        gone = [rest(gw, "k") for _ in range(5)]
        assert [a[0] for a in gone] == [200] * 5
        assert max(a[3] for a in gone) < 1.0
        allowed = metric_value(scrape_metrics(gw), "gateway_rate_limit_redis_errors_total", policy="limit",
                               decision="allowed")
        assert allowed - before == 10

        redis.start()  # back (empty: its buckets are full again), found again after the backoff
        wait_for(limited, 15, "the gateway to use Redis again")
        wait_for(lambda: "Redis could not answer" in gw.log(), 10, "the log line about Redis")


def test_on_error_deny_refuses_while_redis_is_unreachable(tmp_path: Path) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    with GatewayProcess(write_config(tmp_path, _global(nobody, on_error="deny")), tmp_path / "gw.log") as gw:
        answers = [rest(gw, "k") for _ in range(5)]
        assert [a[0] for a in answers] == [429] * 5
        assert max(a[3] for a in answers) < 1.0
        _, headers, body, _ = answers[0]
        assert headers["Retry-After"] == "1"
        assert json.loads(body) == {"error": "policy 'limit' cannot check its rate limit now; retry later"}
        assert nobody not in body.decode()
        samples = scrape_metrics(gw)
        assert metric_value(samples, "gateway_rate_limit_redis_errors_total", decision="denied") == 5
        assert metric_value(samples, "gateway_rate_limited_total") == 0  # not past a bucket


# --- config -----------------------------------------------------------------------


def _parse(policies: str, redis: str = "") -> Any:
    import yaml

    text = f"""
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams: [{{name: local, protocol: builtin}}]
{redis}
policies: {policies}
routes: [{{match: {{model: "*"}}, upstream: local, policies: [limit]}}]
"""
    return parse_config(yaml.safe_load(text))


def test_options_parse() -> None:
    config = _parse('[{name: limit, rate_limit: {requests_per_second: 2.5, key: [client_ip, "header:X-Team"], '
                    'scope: global}}]', 'redis: {address: "127.0.0.1:6390"}')
    options = config.policies[0].options
    assert (options.requests_per_second, options.burst, options.key, options.scope) == \
        (2.5, 3, ("client_ip", "header:X-Team"), "global")  # burst defaults to a second's worth
    assert (config.redis.address, config.redis.timeout, config.redis.on_error) == ("127.0.0.1:6390", 0.05, "allow")


@pytest.mark.parametrize(("policy", "redis", "problem"), [
    ("{requests_per_second: 0}", "", "policies[0].rate_limit.requests_per_second: must be from 1e-06 to 1e+09"),
    ("{requests_per_second: .inf}", "", "policies[0].rate_limit.requests_per_second: must be from"),
    ("{requests_per_second: 1, burst: 2000000000}", "", "policies[0].rate_limit.burst: must be at most"),
    ("{burst: 4}", "", "policies[0].rate_limit.requests_per_second: is required"),
    ("{requests_per_second: 1, burst: 0}", "", "policies[0].rate_limit.burst: must be at least 1"),
    ("{requests_per_second: 1, key: user}", "", "policies[0].rate_limit.key: must be client_ip, model"),
    ("{requests_per_second: 1, key: [model, model]}", "", "policies[0].rate_limit.key: names 'model' twice"),
    ("{requests_per_second: 1, scope: cluster}", "", "policies[0].rate_limit.scope: must be one of local, global"),
    ("{requests_per_second: 1, per: 1s}", "", "policies[0].rate_limit.per: unknown key"),
    ("{requests_per_second: 1, scope: global}", "", "policies: policy 'limit' needs Redis"),
    ("{requests_per_second: 1}", "redis: {address: nowhere}", "redis.address: must be an address"),
    ("{requests_per_second: 1}", 'redis: {address: "127.0.0.1:1", on_error: retry}',
     "redis.on_error: must be one of allow, deny"),
    ("{requests_per_second: 1}", 'redis: {address: "127.0.0.1:1", timeout: 0}', "redis.timeout: must be more than 0"),
])
def test_bad_options_are_config_errors(policy: str, redis: str, problem: str) -> None:
    with pytest.raises(ConfigError) as error:
        _parse(f"[{{name: limit, rate_limit: {policy}}}]", redis)
    assert any(p.startswith(problem) for p in error.value.problems), error.value.problems
