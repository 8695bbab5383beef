"""A bounded load generator for tests: V2 REST infer calls over aiohttp.

Bounded in count and time; records per request when it started, how it
ended and which upstream server answered (the echo peer's SERVER output).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

PAYLOAD = {"inputs": [{"name": "x", "datatype": "INT32", "shape": [4], "data": [1, 2, 3, 4]}]}


@dataclass
class Result:
    started: float  # time.monotonic()
    elapsed: float
    status: int  # 0: no HTTP answer (connection refused, reset, ...)
    server: str = ""
    error: str = ""
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == 200


def output(body: dict[str, Any], name: str) -> Any:
    return next(o["data"] for o in body.get("outputs", []) if o["name"] == name)


async def infer(session: aiohttp.ClientSession, base: str, model: str, headers: dict[str, str] | None = None,
                payload: dict[str, Any] | None = None, timeout: float = 10.0) -> Result:
    started = time.monotonic()
    try:
        async with session.post(f"{base}/v2/models/{model}/infer", json=payload or PAYLOAD, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as reply:
            body = json.loads(await reply.read())
            named = {o["name"] for o in body.get("outputs", [])} if reply.status == 200 else set()
            server = output(body, "SERVER")[0] if "SERVER" in named else ""  # only echo peers name themselves
            return Result(started, time.monotonic() - started, reply.status, server, body.get("error", ""), body)
    except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
        return Result(started, time.monotonic() - started, 0, error=f"{type(exc).__name__}: {exc}")


async def run_load(base: str, model: str, *, total: int | None = None, duration: float | None = None,
                   concurrency: int = 8, headers: dict[str, str] | None = None,
                   payload: dict[str, Any] | None = None, stop: asyncio.Event | None = None) -> list[Result]:
    """``concurrency`` workers send requests back to back until ``total``
    requests were sent, ``duration`` seconds passed or ``stop`` is set."""
    assert total is not None or duration is not None, "load must be bounded"
    results: list[Result] = []
    deadline = time.monotonic() + (duration if duration is not None else 120.0)
    sent = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal sent
        while time.monotonic() < deadline and (total is None or sent < total) and not (stop and stop.is_set()):
            sent += 1
            results.append(await infer(session, base, model, headers, payload))

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return results


def assert_all_answered(results: list[Result], at_least: int) -> None:
    """Every request got a 200, and there were enough of them to mean something."""
    failed = [r for r in results if not r.ok]
    assert not failed, f"{len(failed)} of {len(results)} failed, e.g. {failed[:3]}"
    assert len(results) >= at_least, f"only {len(results)} requests were sent"
