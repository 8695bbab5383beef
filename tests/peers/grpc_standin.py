"""A V2 gRPC upstream stand-in that records the exact ModelInfer bytes it
receives and answers bytes the test chose.

No real server shows the bytes it was sent, or answers with fields a
re-encode would drop (unknown fields, parameter kinds our schema lacks),
so the pass-through tests use this one; it runs in the test's event loop on
a real loopback socket. Everything else goes to the real MLServer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from gateway.protocols.v2_grpc import messages as pb


class GrpcStandin:
    """``ModelInfer`` only: each call's request bytes are appended to
    ``received``; the answer is ``reply(request_bytes)``, or the next
    status code of ``failures`` (popped) as an error."""

    def __init__(self, reply: Callable[[bytes], bytes]) -> None:
        self.reply = reply
        self.received: list[bytes] = []
        self.failures: list[grpc.StatusCode] = []
        self.port = 0
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _infer(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.received.append(request)
        if self.failures:
            await context.abort(self.failures.pop(0), "the stand-in was told to fail")
        return self.reply(request)

    async def start(self) -> GrpcStandin:
        # No (de)serializers: grpc hands over and sends bytes as they are.
        handler = grpc.unary_unary_rpc_method_handler(self._infer)
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1), ("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(pb.SERVICE, {"ModelInfer": handler}),))
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

    async def __aenter__(self) -> GrpcStandin:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()
