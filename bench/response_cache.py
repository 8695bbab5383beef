"""What a response_cache policy costs and saves a gateway process: CPU per
request (user + system, from /proc) and median latency of V2 REST JSON
``simple`` requests at concurrency 1, one keep-alive connection, on three
routes that differ only in their policy:

- ``plain``: no policy (the baseline);
- ``hit``: a response_cache, the same request every time (every one a hit);
- ``miss``: the same cache, different inputs every time (every one a miss:
  key, look-up, the answer copied and stored, evictions past max_bytes);

and, for latency, ``through``: no policy, to a second gateway process over
V2 REST (an upstream that answers over the network, as a model server does).
With ``--redis``, two more rows with the same cache on ``backend: redis``
(a redis-server of its own on 127.0.0.1; its CPU per request printed apart):
``redis-hit`` and ``redis-miss``. Rounds take turns so the shared machine's
noise falls on every row alike.

    cd <repo> && .venv/bin/python bench/response_cache.py --requests 2000 --rounds 5 [--redis]

Runs against builtin upstreams on 127.0.0.1, port 0.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from peers.redis_server import RedisServer
from support import GatewayProcess, write_config

BACK = """
admin: {address: null}
listeners: [{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}]
upstreams: [{name: local, protocol: builtin}]
routes: [{match: {model: "*"}, upstream: local}]
"""


def front(back_rest: str, redis: str | None = None) -> str:
    """The bench's gateway: with ``redis``, also a cache with backend: redis."""
    policies = ["{name: cache, response_cache: {ttl: 600s, max_bytes: 16MiB}}"]
    routes = [f"{{match: {{model: simple, headers: {{x-row: {row}}}}}, upstream: local, policies: [cache]}}"
              for row in ("hit", "miss")]
    shared = ""
    if redis is not None:
        shared = f'redis: {{address: "{redis}", timeout: 1s}}'
        policies.append("{name: rcache, response_cache: {ttl: 600s, backend: redis}}")
        routes += [f"{{match: {{model: simple, headers: {{x-row: {row}}}}}, upstream: local, policies: [rcache]}}"
                   for row in ("redis-hit", "redis-miss")]
    routes += ["{match: {model: simple, headers: {x-row: through}}, upstream: back}",
               "{match: {model: simple}, upstream: local}"]
    return f"""
admin: {{address: null}}
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams:
  - {{name: local, protocol: builtin}}
  - {{name: back, protocol: v2-rest, endpoints: ["{back_rest}"]}}
{shared}
policies: [{", ".join(policies)}]
routes:
""" + "".join(f"  - {route}\n" for route in routes)


def body(first: int) -> bytes:
    return orjson.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(first, first + 16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]})


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_row(connection: http.client.HTTPConnection, row: str, requests: int, fresh: itertools.count[int],
            pid: int) -> tuple[float, float]:
    """(CPU µs per request, median latency µs) of ``requests`` requests of ``row``."""
    headers = {"Content-Type": "application/json", "x-row": row}
    bodies = [body(next(fresh) * 16) if row.endswith("miss") else body(0) for _ in range(requests)]
    latencies = []
    before = cpu_seconds(pid)
    for payload in bodies:
        started = time.perf_counter()
        connection.request("POST", "/v2/models/simple/infer", payload, headers)
        reply = connection.getresponse()
        reply.read()
        latencies.append(time.perf_counter() - started)
        if reply.status != 200:
            raise RuntimeError(f"{row}: HTTP {reply.status}")
    return (cpu_seconds(pid) - before) * 1e6 / requests, statistics.median(latencies) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--redis", action="store_true", help="add rows with backend: redis")
    args = parser.parse_args()
    rows = ("plain", "hit", "miss", "through") + (("redis-hit", "redis-miss") if args.redis else ())
    cpu: dict[str, list[float]] = {row: [] for row in rows}
    latency: dict[str, list[float]] = {row: [] for row in rows}
    redis_cpu: dict[str, list[float]] = {row: [] for row in rows}
    fresh = itertools.count(1)
    with tempfile.TemporaryDirectory() as directory, contextlib.ExitStack() as stack:
        folder = Path(directory)
        redis = stack.enter_context(RedisServer(folder)) if args.redis else None
        back = stack.enter_context(GatewayProcess(write_config(folder, BACK, "back.yaml"), folder / "back.log"))
        gw = stack.enter_context(GatewayProcess(
            write_config(folder, front(back.url("rest"), redis and redis.address)), folder / "front.log"))
        assert gw.proc is not None
        host, port = gw.url("rest").split(":")
        connection = http.client.HTTPConnection(host, int(port))
        for row in rows:
            run_row(connection, row, 200, fresh, gw.proc.pid)  # warm-up
        for _ in range(args.rounds):
            for row in rows:
                redis_before = cpu_seconds(redis.proc.pid) if redis is not None and redis.proc else 0.0
                used, median = run_row(connection, row, args.requests, fresh, gw.proc.pid)
                cpu[row].append(used)
                latency[row].append(median)
                if redis is not None and redis.proc:
                    redis_cpu[row].append((cpu_seconds(redis.proc.pid) - redis_before) * 1e6 / args.requests)
        connection.close()
    print(f"{args.rounds} rounds x {args.requests} requests per row, V2 REST JSON `simple`, concurrency 1")
    print(f"{'row':8} {'CPU µs/request (median; each round)':60} median latency µs")
    for row in rows:
        rounds = " ".join(f"{v:.0f}" for v in cpu[row])
        print(f"{row:10} {statistics.median(cpu[row]):6.0f}  ({rounds}){'':{max(0, 42 - len(rounds))}} "
              f"{statistics.median(latency[row]):.0f}")
    if args.redis:
        print("redis-server CPU µs/request (median): " + ", ".join(
            f"{row} {statistics.median(redis_cpu[row]):.0f}" for row in rows))


if __name__ == "__main__":
    main()
