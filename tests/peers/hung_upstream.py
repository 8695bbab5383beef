"""Upstreams that never answer, and one that answers garbage, for tests of
what the gateway does while it waits: they record when each call arrived
and when the gateway gave it up.

Both run in threads of the test process on 127.0.0.1, port 0, so a test
with the gateway in its own process can watch them from plain code.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

SERVICE = "inference.GRPCInferenceService"
_MAX_HOLD_S = 120.0  # a hung call is let go after this even if nobody cancels it


class HungHttpServer:
    """Accepts TCP connections, reads whatever comes and never answers.
    ``opened`` and ``closed`` hold the monotonic time each connection was
    accepted and seen closed by its peer (the gateway), in order; ``reply``
    (bytes), when set, is sent once the first bytes arrive, and the
    connection is then closed (an upstream answering garbage)."""

    def __init__(self, reply: bytes | None = None) -> None:
        self.reply = reply
        self.opened: list[float] = []
        self.closed: list[float] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._connections: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def open_now(self) -> int:
        with self._lock:
            return len(self.opened) - len(self.closed)

    def start(self) -> HungHttpServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        self._listener.close()
        with self._lock:
            for connection in self._connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.opened.append(time.monotonic())
                self._connections.append(connection)
            threading.Thread(target=self._hold, args=(connection,), daemon=True).start()

    def _hold(self, connection: socket.socket) -> None:
        connection.settimeout(_MAX_HOLD_S)
        try:
            while connection.recv(65536):
                if self.reply is not None:
                    connection.sendall(self.reply)
                    break
        except OSError:
            pass
        finally:
            with self._lock:
                self.closed.append(time.monotonic())
            connection.close()


class HungGrpcServer:
    """A V2 gRPC server whose every ModelInfer waits until its caller
    cancels it. ``started`` and ``cancelled`` hold the monotonic time each
    call arrived and ended without an answer."""

    def __init__(self) -> None:
        self.started: list[float] = []
        self.cancelled: list[float] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = grpc.server(ThreadPoolExecutor(max_workers=64), options=[("grpc.so_reuseport", 0)])
        handler = grpc.unary_unary_rpc_method_handler(self._infer)
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": handler}),))
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> HungGrpcServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.stop(0).wait(5)

    def _infer(self, request: bytes, context: grpc.ServicerContext) -> Any:
        with self._lock:
            self.started.append(time.monotonic())
        deadline = time.monotonic() + _MAX_HOLD_S
        while context.is_active() and not self._stopping.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not context.is_active():
            with self._lock:
                self.cancelled.append(time.monotonic())
        context.abort(grpc.StatusCode.UNAVAILABLE, "the hung stand-in was stopped")
