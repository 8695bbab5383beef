"""An upstream that records what reached it over the wire: V2 REST on
aiohttp and V2 gRPC on grpc.aio, in one process on 127.0.0.1.

Real model servers do not tell a client which headers, gRPC metadata or
gRPC deadline their handler received (grpcio hides ``grpc-timeout`` from the
metadata and MLServer drops it), so tests that check what the gateway
*sends* ask this server instead. It is a measuring instrument, not a model
server: every infer sleeps ``x-delay-ms`` (header or metadata) and answers
a valid empty V2 response naming the model.

``GET /calls`` (REST port) returns every call seen so far, oldest first:
``{"transport", "path", "headers", "time_remaining"}`` (seconds, gRPC
only; ``null`` without a deadline); ``GET /unrouted`` the raw paths of REST
requests no route of it took (answered 404). It shares no code with the
gateway.

Run: ``python -m peers.recording_upstream PORT_FILE`` (writes
``{"rest": P, "grpc": Q}``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DELAY_HEADER = "x-delay-ms"
SERVICE = "inference.GRPCInferenceService"


def _string_field(number: int, value: str) -> bytes:
    """One length-delimited protobuf field (names here are short)."""
    data = value.encode()
    assert len(data) < 128
    return bytes([number << 3 | 2, len(data)]) + data


def _model_name_of(request: bytes) -> str:
    """Field 1 (``model_name``) of a ModelInferRequest; names here are short."""
    if len(request) >= 2 and request[0] == 0x0A and request[1] < 128:
        return request[2:2 + request[1]].decode(errors="replace")
    return ""


async def serve(port_file: Path) -> None:
    import grpc
    from aiohttp import web

    calls: list[dict[str, Any]] = []

    async def delay(headers: dict[str, str]) -> None:
        milliseconds = float(headers.get(DELAY_HEADER, "0") or 0)
        if milliseconds:
            await asyncio.sleep(milliseconds / 1000)

    # --- REST ------------------------------------------------------------------
    async def rest_infer(request: web.Request) -> web.Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        calls.append({"transport": "rest", "path": request.path, "headers": headers, "time_remaining": None})
        await request.read()
        await delay(headers)
        return web.json_response({"model_name": request.match_info["model"], "outputs": []})

    async def rest_ready(request: web.Request) -> web.Response:
        return web.json_response({})

    async def rest_calls(request: web.Request) -> web.Response:
        return web.json_response(calls)

    unrouted: list[str] = []

    async def rest_unrouted(request: web.Request) -> web.Response:
        if request.path == "/unrouted":
            return web.json_response(unrouted)
        unrouted.append(request.raw_path)  # as sent: aiohttp's own path has dot segments resolved
        return web.json_response({"error": "not found"}, status=404)

    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", rest_infer)
    app.router.add_get("/v2/health/ready", rest_ready)
    app.router.add_get("/calls", rest_calls)
    app.router.add_route("*", "/{tail:.*}", rest_unrouted)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    rest_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    # --- gRPC (bytes in, bytes out: no generated code needed) ----------------------
    async def grpc_infer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        headers = {k.lower(): v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        calls.append({"transport": "grpc", "path": f"/{SERVICE}/ModelInfer", "headers": headers,
                      "time_remaining": context.time_remaining()})
        await delay(headers)
        return _string_field(1, _model_name_of(request))  # ModelInferResponse{model_name}

    async def grpc_ready(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b"\x08\x01"  # ServerReadyResponse{ready: true}

    def identity(data: bytes) -> bytes:
        return data

    handlers = {name: grpc.unary_unary_rpc_method_handler(method, request_deserializer=identity,
                                                          response_serializer=identity)
                for name, method in (("ModelInfer", grpc_infer), ("ServerReady", grpc_ready))}
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()

    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rest": rest_port, "grpc": grpc_port}))
    tmp.replace(port_file)
    await asyncio.Event().wait()


class RecordingUpstream:
    """The recorder in its own process, stopped by its process id."""

    def __init__(self, directory: Path) -> None:
        self.port_file = directory / "recorder.ports.json"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}

    def start(self, timeout: float = 20.0) -> RecordingUpstream:
        from support import wait_for

        self.port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen([sys.executable, __file__, str(self.port_file)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc = self.proc
        wait_for(lambda: self.port_file.exists() or proc.poll() is not None, timeout, "the recorder to listen")
        if proc.poll() is not None:
            raise RuntimeError(f"the recorder exited with {proc.returncode}")
        self.ports = json.loads(self.port_file.read_text())
        return self

    def address(self, transport: str) -> str:
        return f"127.0.0.1:{self.ports[transport]}"

    def calls(self) -> list[dict[str, Any]]:
        import urllib.request

        with urllib.request.urlopen(f"http://{self.address('rest')}/calls", timeout=5) as reply:
            return json.loads(reply.read())  # type: ignore[no-any-return]

    def unrouted(self) -> list[str]:
        import urllib.request

        with urllib.request.urlopen(f"http://{self.address('rest')}/unrouted", timeout=5) as reply:
            return json.loads(reply.read())  # type: ignore[no-any-return]

    def call_with(self, header: str, value: str, timeout: float = 5.0) -> dict[str, Any]:
        """The first recorded call whose ``header`` is ``value`` (bounded wait)."""
        deadline = time.monotonic() + timeout
        while True:
            found = next((c for c in self.calls() if c["headers"].get(header) == value), None)
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"no call with {header}: {value} reached the recorder")
            time.sleep(0.05)

    def stop(self) -> None:
        from support import stop_process

        if self.proc is not None:
            stop_process(self.proc)

    def __enter__(self) -> RecordingUpstream:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1])))
