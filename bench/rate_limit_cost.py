"""What a rate_limit policy adds to a request's CPU, end to end.

    .venv/bin/python bench/rate_limit_cost.py [--seconds 4] [--rounds 3]

Scenario h's setup (bench/run.py): a C upstream answering `simple` from
memory (an nginx ``return 200``), one gateway process in front of it, wrk at
concurrency 16, the CPU of the gateway's process tree from /proc per request.
Three gateways take turns: the route without a policy, with a local
rate_limit, with a global one (a real redis-server started here); the limits
never refuse (a huge bucket), so every request pays the check and goes on.
Then, in one process, the client's own cost per call: ours and redis-py's
asyncio client (when importable) running the same EVALSHA against the same
server. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH.parent / "tests"))
sys.path.insert(0, str(BENCH))

from harness import Process, free_port, wait_port, wrk  # noqa: E402
from run import Bench, _c_upstream_config, _c_upstream_server, _check_errors, _simple_json  # noqa: E402

HUGE = 10**9  # tokens: the limit is checked and never reached
PATH = "/v2/models/simple/infer"


def _config(upstream: str, policy: str, redis: str) -> str:
    base = _c_upstream_config(upstream, access_log=False)
    if not policy:
        return base
    return (base.replace("    upstream: c\n", "    upstream: c\n    policies: [limit]\n")
            + f"policies: [{{name: limit, rate_limit: {{requests_per_second: {HUGE}, burst: {HUGE}, "
              f"key: client_ip, scope: {policy}}}}}]\n" + (f'redis: {{address: "{redis}"}}\n' if redis else ""))


def end_to_end(bench: Bench, redis: str, seconds: float, rounds: int) -> dict[str, tuple[float, float]]:
    up_port = free_port()
    upstream = bench._nginx("rl-upstream", up_port, _c_upstream_server(up_port))
    del upstream
    address = f"127.0.0.1:{up_port}"
    arms: dict[str, tuple[str, Process]] = {}
    for name, scope in (("no policy", ""), ("rate_limit local", "local"), ("rate_limit global (Redis)", "global")):
        proc, ports = bench.gateway(f"rl-{scope or 'none'}", _config(address, scope, redis if scope else ""))
        arms[name] = (f"http://127.0.0.1:{ports['rest']}{PATH}", proc)
    body = _simple_json()
    for url, _ in arms.values():
        wrk(url, body, 16, 1.0, threads=2)  # warm: connections, first requests, Redis script loaded
    cpu = dict.fromkeys(arms, 0.0)
    requests = dict.fromkeys(arms, 0)
    elapsed = dict.fromkeys(arms, 0.0)
    names = list(arms)
    results = []
    for i in range(rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            url, proc = arms[name]
            before = proc.tree_cpu_seconds()
            result = wrk(url, body, 16, seconds, threads=2)
            cpu[name] += proc.tree_cpu_seconds() - before
            requests[name] += result.requests
            elapsed[name] += result.requests / result.requests_per_second
            results.append((f"{name} #{i}", result))
    _check_errors(dict(results))
    return {name: (cpu[name] * 1e6 / requests[name], requests[name] / elapsed[name]) for name in arms}


def filter_cost(calls: int) -> dict[str, float]:
    """CPU microseconds of the local filter's on_request alone (the
    coroutine made and run to its end, as the chain runs it), per key kind;
    and, for key client_ip, what the route's whole chain adds around an
    upstream call (the FilterCall, the chain's run, on_request and the
    filter's on_response) over calling the upstream without a chain."""
    from gateway.app.configure import parse_config
    from gateway.core.record import RequestRecord
    from gateway.core.types import InferRequest, InferResponse, RequestContext
    from gateway.dataplane.filters.base import INFER, FilterCall, FilterChain
    from gateway.dataplane.filters.rate_limit import RateLimitFilter, RateLimitOptions
    from gateway.runtime.services import GatewayServices

    config = parse_config({"listeners": [{"name": "rest", "protocol": "v2-rest", "address": "127.0.0.1:0"}],
                           "upstreams": [{"name": "local", "protocol": "builtin"}],
                           "routes": [{"match": {"model": "*"}, "upstream": "local"}]})
    services = GatewayServices(config, config.server)
    ctx = RequestContext("rest", "v2-rest", headers={"x-api-key": "k-1"}, record=RequestRecord(peer="10.0.0.7"))
    request = InferRequest("simple", "", "", [])
    call = FilterCall(request, ctx, None, INFER)
    answer = InferResponse("simple", "1", "", [])

    async def upstream() -> InferResponse:
        return answer

    costs = {}
    for key in ((), ("client_ip",), ("header:x-api-key",), ("client_ip", "model")):
        step = RateLimitFilter("bench", RateLimitOptions(HUGE, HUGE, key), services)
        costs[f"key: {list(key) if key else 'none'}"] = _best_us(lambda step=step: step.on_request(call), calls)
    chain = FilterChain((RateLimitFilter("bench", RateLimitOptions(HUGE, HUGE, ("client_ip",)), services),))
    chained = _best_us(lambda: chain.run(FilterCall(request, ctx, None, INFER), lambda: upstream()), calls)
    costs["key: ['client_ip'], its chain around the upstream call"] = chained - _best_us(upstream, calls)
    return costs


def _best_us(make: Any, calls: int) -> float:
    """CPU microseconds per coroutine ``make()`` makes and runs to its end
    (none of these suspends), the best of five runs."""
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(calls):
            try:
                make().send(None)
            except StopIteration:
                pass
        best = min(best, (time.process_time() - started) / calls * 1e6)
    return best


async def _client_cost(redis: str, calls: int) -> dict[str, float]:
    """CPU microseconds per EVALSHA of the GCRA script, one call at a time
    and 16 at once, for each client."""
    from gateway.config.redis import RedisConfig
    from gateway.dataplane.filters.rate_limit import GCRA_SCRIPT
    from gateway.runtime.redis import RedisClient

    ours = RedisClient(RedisConfig(redis, timeout=1.0))
    args = (repr(1e-9), repr(1.0))

    async def ours_call(i: int) -> Any:
        return await ours.evalsha(GCRA_SCRIPT, (f"bench:{i % 64}",), args)

    clients: dict[str, Any] = {"ours (gateway/runtime/redis.py)": ours_call}
    try:
        import redis.asyncio as redispy  # not a dependency: measured when installed

        host, port = redis.rsplit(":", 1)
        theirs = redispy.Redis(host=host, port=int(port), socket_timeout=1.0)
        script = theirs.register_script(GCRA_SCRIPT.source)

        async def theirs_call(i: int) -> Any:
            return await script(keys=[f"bench:{i % 64}"], args=list(args))

        hiredis = "hiredis" if redispy.connection.HIREDIS_AVAILABLE else "pure-Python parser"
        clients[f"redis-py {redispy.__version__ if hasattr(redispy, '__version__') else ''} ({hiredis})"] = \
            theirs_call
    except ImportError:
        pass
    costs: dict[str, float] = {}
    for name, call in clients.items():
        for _ in range(200):
            await call(0)
        for concurrency in (1, 16):
            best = float("inf")
            for _ in range(3):
                started = time.process_time()
                for start in range(0, calls, concurrency):
                    await asyncio.gather(*(call(start + j) for j in range(concurrency)))
                best = min(best, (time.process_time() - started) / calls * 1e6)
            costs[f"{name}, {concurrency} at once"] = best
    await ours.close()
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5000)
    options = parser.parse_args()
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is missing: sh scripts/ensure-redis.sh")
    with tempfile.TemporaryDirectory(prefix="rate-limit-bench-") as temp:
        workdir = Path(temp)
        port = free_port()
        server = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                                   "--appendonly", "no", "--dir", temp], stdout=subprocess.DEVNULL)
        bench = Bench(workdir, options.seconds, 1)
        try:
            wait_port(port, proc=server)
            redis = f"127.0.0.1:{port}"
            import uvloop

            alone = filter_cost(options.calls * 20)
            costs = uvloop.run(_client_cost(redis, options.calls))
            rows = end_to_end(bench, redis, options.seconds, options.rounds)
        finally:
            bench.close()
            server.terminate()
            server.wait(10)
    base = rows["no policy"][0]
    print(f"| gateway, wrk c16, {options.rounds} x {options.seconds:g} s each | CPU µs per request | added | req/s |")
    print("|---|---|---|---|")
    for name, (us, rps) in rows.items():
        print(f"| {name} | {us:.1f} | {us - base:+.1f} | {rps:.0f} |")
    print()
    print("| local rate_limit's on_request alone (and its chain) | CPU µs per call |")
    print("|---|---|")
    for name, us in alone.items():
        print(f"| {name} | {us:.2f} |")
    print()
    print(f"| Redis client, EVALSHA of the GCRA script, {options.calls} calls | CPU µs per call |")
    print("|---|---|")
    for name, us in costs.items():
        print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
    main()
