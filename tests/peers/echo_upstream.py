"""A controllable V2 upstream stand-in, one process speaking both V2 REST
(aiohttp) and V2 gRPC (grpc.aio) over real loopback sockets.

No real model server can be told to slow down, fail with 503, turn unready
or die on cue, so the resilience, reload and drain tests put the product's
own ``v2-rest`` and ``v2-grpc`` upstream clients in front of this one. Every
answer echoes the inputs and adds two BYTES outputs: ``SERVER`` (which
stand-in answered) and ``HEADERS`` (JSON of the HTTP headers or gRPC
metadata it received), so tests see load balancing, splits and header
forwarding from the client side. A request parameter ``delay_ms`` delays
that one answer; ``control(hold=True)`` holds every answer until
``control(hold=False)``, so a test can wait for a condition while requests
are in flight instead of guessing a time.

Run: ``python -m peers.echo_upstream --id A --port-file F [--rest-port P --grpc-port Q --delay S]``;
the port file holds ``{"rest": P, "grpc": Q}`` once both listen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web

from gateway.protocols.v2_grpc import messages as pb

TESTS = Path(__file__).resolve().parent.parent
# Child processes import the test peers from the tests folder.
ECHO_ENV = {"PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
WIRES = {"rest": "v2-rest", "grpc": "v2-grpc"}  # short name -> the upstream protocol reaching it
# An HTTP status the stand-in is told to answer, as the gRPC code a V2 server gives for it.
_GRPC_CODE = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
              500: grpc.StatusCode.INTERNAL, 503: grpc.StatusCode.UNAVAILABLE}
# gRPC metadata that grpc itself adds, not the caller.
_GRPC_OWN = ("user-agent", "grpc-", ":")

# --- the server process ---------------------------------------------------------


class EchoState:
    def __init__(self, name: str, delay: float) -> None:
        self.name = name
        self.delay = delay
        self.ready = True
        self.status = 200  # anything else: infer answers this status (its gRPC code over gRPC)
        self.infer_count = 0
        self.other_calls = {"metadata": 0, "model_ready": 0, "server_ready": 0}  # for /stats
        self.in_flight = 0
        self.max_in_flight = 0
        self.answered = 0
        self.released = asyncio.Event()  # cleared: answers wait for it
        self.released.set()

    async def serve_infer(self, delay_ms: float, answer: Callable[[], Awaitable[Any]],
                          fail: Callable[[str], Awaitable[Any]]) -> Any:
        """One infer, whichever transport: count it, wait, then fail or answer."""
        self.infer_count += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            delay = self.delay + delay_ms / 1000
            if delay:
                await asyncio.sleep(delay)
            await self.released.wait()
            self.answered += 1
            if self.status != 200:
                return await fail(f"echo {self.name} answers {self.status}")
            return await answer()
        finally:
            self.in_flight -= 1


def build_app(state: EchoState) -> web.Application:
    async def infer(request: web.Request) -> web.Response:
        body = await request.json()

        async def answer() -> web.Response:
            headers = {k.lower(): v for k, v in request.headers.items()}
            outputs = [{k: item[k] for k in ("name", "datatype", "shape", "data")} for item in body["inputs"]]
            outputs.append({"name": "SERVER", "datatype": "BYTES", "shape": [1], "data": [state.name]})
            outputs.append({"name": "HEADERS", "datatype": "BYTES", "shape": [1], "data": [json.dumps(headers)]})
            return web.json_response({"model_name": request.match_info["model"], "id": body.get("id", ""),
                                      "outputs": outputs})

        async def fail(message: str) -> web.Response:
            return web.json_response({"error": message}, status=state.status)

        delay_ms = float(body.get("parameters", {}).get("delay_ms", 0))
        return await state.serve_infer(delay_ms, answer, fail)  # type: ignore[no-any-return]

    async def server_metadata(request: web.Request) -> web.Response:
        # No binary tensor extension: the gateway sends JSON.
        return web.json_response({"name": "echo", "version": "1", "extensions": []})

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
        if "hold" in changes:
            (state.released.clear if changes["hold"] else state.released.set)()
        return web.json_response({"ok": True})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"infer": state.infer_count, "answered": state.answered,
                                  "in_flight": state.in_flight, "max_in_flight": state.max_in_flight,
                                  **state.other_calls})

    app = web.Application()
    app.router.add_get("/v2", server_metadata)
    app.router.add_post("/v2/models/{model}/infer", infer)
    app.router.add_get("/v2/models/{model}", metadata)
    app.router.add_get("/v2/models/{model}/ready", ready)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_post("/control", control)
    app.router.add_get("/stats", stats)
    return app


def _bytes_raw(text: str) -> bytes:
    """One BYTES element as raw contents: a uint32 LE length, then the bytes."""
    data = text.encode()
    return struct.pack("<I", len(data)) + data


def _delay_ms(message: Any) -> float:
    if "delay_ms" not in message.parameters:
        return 0.0
    parameter = message.parameters["delay_ms"]
    return float(getattr(parameter, parameter.WhichOneof("parameter_choice")))


def grpc_handlers(state: EchoState) -> grpc.GenericRpcHandler:
    async def model_infer(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        message = pb.ModelInferRequest.FromString(data)

        async def answer() -> bytes:
            headers = {k: v for k, v in context.invocation_metadata() or ()
                       if isinstance(v, str) and not k.startswith(_GRPC_OWN)}
            reply = pb.ModelInferResponse(model_name=message.model_name, model_version=message.model_version,
                                          id=message.id)
            for item in message.inputs:
                output = reply.outputs.add(name=item.name, datatype=item.datatype, shape=item.shape)
                if not message.raw_input_contents:
                    output.contents.CopyFrom(item.contents)
            extra = (("SERVER", state.name), ("HEADERS", json.dumps(headers)))
            for name, text in extra:
                output = reply.outputs.add(name=name, datatype="BYTES", shape=[1])
                if not message.raw_input_contents:
                    output.contents.bytes_contents.append(text.encode())
            if message.raw_input_contents:  # raw for one output means raw for all
                reply.raw_output_contents.extend([*message.raw_input_contents, *(_bytes_raw(t) for _, t in extra)])
            return bytes(reply.SerializeToString())

        async def fail(text: str) -> bytes:
            await context.abort(_GRPC_CODE.get(state.status, grpc.StatusCode.UNKNOWN), text)
            raise AssertionError("abort raises")

        return await state.serve_infer(_delay_ms(message), answer, fail)  # type: ignore[no-any-return]

    async def server_ready(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return bytes(pb.ServerReadyResponse(ready=state.ready).SerializeToString())

    async def model_ready(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return bytes(pb.ModelReadyResponse(ready=state.ready).SerializeToString())

    async def server_live(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return bytes(pb.ServerLiveResponse(live=True).SerializeToString())

    async def model_metadata(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        name = pb.ModelMetadataRequest.FromString(data).name
        return bytes(pb.ModelMetadataResponse(name=name, versions=["1"], platform="echo").SerializeToString())

    methods = {"ModelInfer": model_infer, "ServerReady": server_ready, "ModelReady": model_ready,
               "ServerLive": server_live, "ModelMetadata": model_metadata}
    # No (de)serializers: the handlers take and give bytes.
    return grpc.method_handlers_generic_handler(pb.SERVICE, {
        name: grpc.unary_unary_rpc_method_handler(handler) for name, handler in methods.items()})


async def serve(name: str, rest_port: int, grpc_port: int, port_file: Path, delay: float) -> None:
    state = EchoState(name, delay)
    runner = web.AppRunner(build_app(state), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", rest_port, reuse_address=True)
    await site.start()
    rest_bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((grpc_handlers(state),))
    grpc_bound = server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    if not grpc_bound:
        raise OSError(f"cannot listen on gRPC port {grpc_port}")
    await server.start()
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rest": rest_bound, "grpc": grpc_bound}))
    tmp.replace(port_file)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--id", required=True)
    parser.add_argument("--rest-port", type=int, default=0)
    parser.add_argument("--grpc-port", type=int, default=0)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    asyncio.run(serve(args.id, args.rest_port, args.grpc_port, args.port_file, args.delay))


class EchoServer:
    """One stand-in process, controlled from a test (stopped by pid)."""

    def __init__(self, name: str, directory: Path, delay: float = 0.0) -> None:
        self.name = name
        self.directory = directory
        self.delay = delay
        self.ports = {"rest": 0, "grpc": 0}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def _port_file(self) -> Path:
        return self.directory / f"echo-{self.name}.ports"

    def launch(self) -> EchoServer:
        """Start the process (on the same ports as before, after a restart)."""
        self._port_file.unlink(missing_ok=True)
        env = {**os.environ, **ECHO_ENV}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "peers.echo_upstream", "--id", self.name, "--rest-port", str(self.ports["rest"]),
             "--grpc-port", str(self.ports["grpc"]), "--port-file", str(self._port_file),
             "--delay", str(self.delay)],
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
        self.ports = json.loads(self._port_file.read_text())
        return self

    def start(self, timeout: float = 20.0, tries: int = 3) -> EchoServer:
        """Launch and wait; a fixed port may be briefly held by someone's
        connection attempt (a client connected to itself): try again."""
        for attempt in range(tries):
            try:
                return self.launch().wait_ready(timeout)
            except RuntimeError:
                if attempt == tries - 1 or not self.ports["rest"]:
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
        """The V2 REST address (also where the test controls it)."""
        return f"127.0.0.1:{self.ports['rest']}"

    def address_for(self, protocol: str) -> str:
        """Where the upstream protocol ``v2-rest`` or ``v2-grpc`` reaches this server."""
        return f"127.0.0.1:{self.ports['grpc' if protocol == 'v2-grpc' else 'rest']}"

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


if __name__ == "__main__":
    main()
