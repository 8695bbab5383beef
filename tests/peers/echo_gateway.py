"""Helpers to drive a gateway process from tests: its REST base URL, its
admin endpoints, and waiting for a condition from async tests."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from support import GatewayProcess, wait_for


def rest_base(gw: GatewayProcess, listener: str = "rest") -> str:
    return f"http://{gw.url(listener)}"


def admin_call(gw: GatewayProcess, path: str, method: str = "GET") -> tuple[int, Any]:
    """(status, JSON body) of an admin endpoint, error statuses included."""
    data = b"" if method == "POST" else None
    request = urllib.request.Request(f"http://127.0.0.1:{gw.ports['admin']}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def upstream_state(gw: GatewayProcess, name: str) -> dict[str, Any]:
    _, body = admin_call(gw, "/upstreams")
    return next(u for u in body["upstreams"] if u["name"] == name)


async def until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """``wait_for`` off the event loop, so the test's own requests go on meanwhile."""
    return await asyncio.to_thread(wait_for, predicate, timeout, what)
