"""The gateway in its own process with the test-only ``echo`` upstream
protocol registered, and helpers to drive it from tests.

Run with ``tests`` on PYTHONPATH: ``python -m peers.echo_gateway serve ...``.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from peers.echo_upstream import ECHO_ENV
from support import GatewayProcess, write_config


def echo_gateway(directory: Path, config: str) -> GatewayProcess:
    """A gateway process (not started) that knows the ``echo`` protocol."""
    return GatewayProcess(write_config(directory, config), directory / "gateway.log", ECHO_ENV,
                          module="peers.echo_gateway")


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


def main() -> int:
    from gateway.cli import main as gateway_main
    from gateway.protocols import registry

    registry.PROTOCOLS["echo"] = "peers.echo_upstream"
    return gateway_main()


if __name__ == "__main__":
    sys.exit(main())
