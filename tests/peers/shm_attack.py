"""Attacks on the system shared-memory registry, measured by a prober.

The attacker runs in its own process (its threads must not hold the
prober's GIL); the prober runs here, one health request at a time, each on
a new connection to another listener (so an acceptor out of descriptors
shows). Everything is bounded in time.
"""

from __future__ import annotations

import http.client
import multiprocessing
import os
import queue
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from peers.stall_attack import HealthProber, Probe

BASE = "/v2/systemsharedmemory"


def post(conn: http.client.HTTPConnection, path: str, body: Any, token: str = "") -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    conn.request("POST", path, body=orjson.dumps(body) if body is not None else b"", headers=headers)
    reply = conn.getresponse()
    return reply.status, reply.read().decode(errors="replace")


def register_many(port: int, key: str, size: int, names: list[str], token: str = "") -> dict[str, Any]:
    """Register ``names`` (all one object), over one connection (a new one
    if the gateway closes it); the statuses and the first refusal."""
    statuses: Counter[int] = Counter()
    refusal = ""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        for name in names:
            try:
                status, text = post(conn, f"{BASE}/region/{name}/register", {"key": key, "byte_size": size}, token)
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                status, text = 0, "connection failed"
            statuses[status] += 1
            if status != 200 and not refusal:
                refusal = text
    finally:
        conn.close()
    return {"statuses": dict(statuses), "refusal": refusal}


def unregister_unknown(port: int, clients: int, rounds: int, token: str = "") -> dict[str, Any]:
    """``clients`` at once, each unregistering ``rounds`` names nobody registered."""
    def client(index: int) -> Counter[int]:
        statuses: Counter[int] = Counter()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            for round_ in range(rounds):
                try:
                    statuses[post(conn, f"{BASE}/region/unknown-{index}-{round_}/unregister", None, token)[0]] += 1
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    statuses[0] += 1
        finally:
            conn.close()
        return statuses

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        total = sum(pool.map(client, range(clients)), Counter())
    return {"statuses": dict(total), "seconds": round(time.monotonic() - started, 2)}


def held(pid: int, key: str) -> list[str]:
    """The process's open descriptors of the object ``key`` (a deleted one too)."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith(f"/dev/shm{key}"):
            found.append(target)
    return found


def _run(target: Callable[..., dict[str, Any]], args: tuple[Any, ...], results: Any) -> None:
    results.put(target(*args))


def probe_during(probe_port: int, target: Callable[..., dict[str, Any]], *args: Any,
                 timeout: float = 120.0) -> tuple[dict[str, Any], Probe]:
    """Run ``target(*args)`` in another process while probing
    ``GET /v2/health/live`` on ``probe_port``; its result and the probe."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    attacker = context.Process(target=_run, args=(target, args, results), daemon=True)
    attacker.start()
    try:
        with HealthProber(probe_port, "/v2/health/live", interval=0.01) as probe:
            try:
                result = results.get(timeout=timeout)
            except queue.Empty:
                result = {"unfinished": f"the attack did not end within {timeout:.0f} s"}
    finally:
        attacker.join(10)
        if attacker.is_alive():
            attacker.kill()
    return result, probe
