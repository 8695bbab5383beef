"""A controllable test upstream: an aiohttp process speaking a V2-REST-like
JSON wire, plus the ``echo`` upstream client the test gateway registers.

No real model server can be told to slow down, fail with 503, turn unready
or die on cue, so the resilience tests use this one; it is registered only by
tests (``peers/echo_gateway.py``), never by the product. Every answer names
the server that gave it (output ``SERVER``) and the headers it received
(output ``HEADERS``, JSON), so tests can see load balancing, splits and
header forwarding from the client side.

Run: ``python -m peers.echo_upstream --id A --port 0 --port-file F [--delay S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gateway.confignode import Node
from gateway.errors import connect_failure, connection_reset
from gateway.protocols.base import UpstreamClient
from gateway.protocols.v2_rest import codec
from gateway.types import InferRequest, InferResponse, ModelMetadata, RequestContext

TESTS = Path(__file__).resolve().parent.parent
# Child processes import the test peers from the tests folder.
ECHO_ENV = {"PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

# --- the server process ---------------------------------------------------------


class EchoState:
    def __init__(self, name: str, delay: float) -> None:
        self.name = name
        self.delay = delay
        self.ready = True
        self.status = 200  # anything else: infer answers this status
        self.infer_count = 0
        self.other_calls = {"metadata": 0, "model_ready": 0, "server_ready": 0}  # for /stats
        self.in_flight = 0
        self.max_in_flight = 0


def build_app(state: EchoState) -> web.Application:
    async def infer(request: web.Request) -> web.Response:
        state.infer_count += 1
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            body = await request.json()
            delay = state.delay + float(body.get("parameters", {}).get("delay_ms", 0)) / 1000
            if delay:
                await asyncio.sleep(delay)
            if state.status != 200:
                return web.json_response({"error": f"echo {state.name} answers {state.status}"},
                                         status=state.status)
            headers = {k.lower(): v for k, v in request.headers.items()}
            outputs = [{k: item[k] for k in ("name", "datatype", "shape", "data")} for item in body["inputs"]]
            outputs.append({"name": "SERVER", "datatype": "BYTES", "shape": [1], "data": [state.name]})
            outputs.append({"name": "HEADERS", "datatype": "BYTES", "shape": [1], "data": [json.dumps(headers)]})
            return web.json_response({"model_name": request.match_info["model"], "id": body.get("id", ""),
                                      "outputs": outputs})
        finally:
            state.in_flight -= 1

    async def metadata(request: web.Request) -> web.Response:
        state.other_calls["metadata"] += 1
        return web.json_response({"name": request.match_info["model"], "versions": ["1"], "platform": "echo",
                                  "inputs": [], "outputs": []})

    async def ready(request: web.Request) -> web.Response:
        state.other_calls["model_ready" if "model" in request.match_info else "server_ready"] += 1
        return web.Response(status=200 if state.ready else 503)

    async def control(request: web.Request) -> web.Response:
        changes = await request.json()
        state.delay = float(changes.get("delay", state.delay))
        state.ready = bool(changes.get("ready", state.ready))
        state.status = int(changes.get("status", state.status))
        return web.json_response({"ok": True})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"infer": state.infer_count, "max_in_flight": state.max_in_flight,
                                  **state.other_calls})

    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    app.router.add_get("/v2/models/{model}", metadata)
    app.router.add_get("/v2/models/{model}/ready", ready)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_post("/control", control)
    app.router.add_get("/stats", stats)
    return app


async def serve(name: str, port: int, port_file: Path, delay: float) -> None:
    runner = web.AppRunner(build_app(EchoState(name, delay)), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, reuse_address=True)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(bound))
    tmp.replace(port_file)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--id", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    asyncio.run(serve(args.id, args.port, args.port_file, args.delay))


class EchoServer:
    """One echo server process, controlled from a test (stopped by pid)."""

    def __init__(self, name: str, directory: Path, delay: float = 0.0) -> None:
        self.name = name
        self.directory = directory
        self.delay = delay
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def _port_file(self) -> Path:
        return self.directory / f"echo-{self.name}.port"

    def launch(self) -> EchoServer:
        """Start the process (on the same port as before, after a restart)."""
        self._port_file.unlink(missing_ok=True)
        env = {**os.environ, **ECHO_ENV}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "peers.echo_upstream", "--id", self.name, "--port", str(self.port),
             "--port-file", str(self._port_file), "--delay", str(self.delay)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self

    def wait_ready(self, timeout: float = 20.0) -> EchoServer:
        from support import wait_for

        proc = self.proc
        assert proc is not None, "launch() first"
        wait_for(lambda: self._port_file.exists() or proc.poll() is not None, timeout,
                 f"echo server {self.name} to start")
        if proc.poll() is not None:
            raise RuntimeError(f"echo server {self.name} exited with {proc.returncode}")
        self.port = int(self._port_file.read_text())
        return self

    def start(self, timeout: float = 20.0, tries: int = 3) -> EchoServer:
        """Launch and wait; a fixed port may be briefly held by someone's
        connection attempt (a client connected to itself): try again."""
        for attempt in range(tries):
            try:
                return self.launch().wait_ready(timeout)
            except RuntimeError:
                if attempt == tries - 1 or not self.port:
                    raise
                time.sleep(0.2)
        raise AssertionError("unreachable")

    @staticmethod
    def start_all(servers: list[EchoServer]) -> None:
        """Start several at once: their start-up times overlap."""
        for server in servers:
            server.launch()
        for server in servers:
            server.wait_ready()

    @staticmethod
    @contextlib.contextmanager
    def running(servers: dict[str, EchoServer]) -> Iterator[dict[str, EchoServer]]:
        """Start them all; stop them all on the way out, whatever happened."""
        try:
            EchoServer.start_all(list(servers.values()))
            yield servers
        finally:
            for server in servers.values():
                server.stop()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://{self.address}{path}", data=data, method=method)
        with urllib.request.urlopen(request, timeout=5) as reply:
            return json.loads(reply.read())

    def control(self, **changes: Any) -> None:
        self._call("POST", "/control", changes)

    def stats(self) -> dict[str, int]:
        return self._call("GET", "/stats")  # type: ignore[no-any-return]

    def kill(self) -> None:
        """Die at once, connections and all (SIGKILL), as a crashed server does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        from support import stop_process

        if self.proc is not None:
            stop_process(self.proc)


# --- the upstream client (registered as protocol "echo" by tests only) --------------


class EchoClient(UpstreamClient):
    """Speaks the echo server's JSON wire to one endpoint over pooled HTTP."""

    @classmethod
    def parse_options(cls, node: Node) -> Any:
        return None

    _session: aiohttp.ClientSession | None = None

    @property
    def base(self) -> str:
        return f"http://{self.endpoint}"

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.upstream.connection_pool.max_connections)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _request(self, method: str, path: str, ctx: RequestContext, body: bytes | None = None,
                       headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        assert self._session is not None, "start() was not called"
        try:
            async with self._session.request(method, self.base + path, data=body,
                                             headers={**ctx.forward_headers, **(headers or {})}) as reply:
                return reply.status, await reply.read()
        except aiohttp.ClientConnectorError as exc:
            raise connect_failure(self.label, str(exc)) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError) as exc:
            raise connection_reset(self.label, str(exc) or type(exc).__name__) from exc

    async def infer(self, request: InferRequest, ctx: RequestContext) -> InferResponse:
        body, headers = codec.encode_infer_request(request, binary=False)
        status, reply = await self._request("POST", f"/v2/models/{request.model_name}/infer", ctx, body,
                                            {**headers, "Content-Type": codec.JSON_TYPE})
        if status != 200:
            raise codec.decode_error(status, reply, self.label)
        return codec.decode_infer_response(reply, None, 1 << 20)

    async def model_metadata(self, model: str, version: str, ctx: RequestContext) -> ModelMetadata:
        status, reply = await self._request("GET", f"/v2/models/{model}", ctx)
        if status != 200:
            raise codec.decode_error(status, reply, self.label)
        return codec.decode_model_metadata(reply)

    async def model_ready(self, model: str, version: str, ctx: RequestContext) -> bool:
        status, _ = await self._request("GET", f"/v2/models/{model}/ready", ctx)
        return status == 200

    async def server_ready(self, ctx: RequestContext) -> bool:
        status, _ = await self._request("GET", "/v2/health/ready", ctx)
        return status == 200



# What the registry reads when the test gateway registers this module as a protocol.
__all__ = ["BACKEND", "ECHO_ENV", "EchoClient", "EchoServer", "EchoState"]
BACKEND = EchoClient

if __name__ == "__main__":
    main()
