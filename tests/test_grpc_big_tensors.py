"""A big binary REST request to a V2 gRPC upstream is held once while the
upstream works: the client's body is let go as soon as the upstream message
exists, and the message once grpc has written it, unless the route may
retry a try that reached the upstream (docs/performance.md, "Big tensors").

The gateway runs in the test's event loop, in front of a stand-in upstream
that, before it answers, looks at what the gateway's code still holds:
every live allocation of the payload's size made by a line of the gateway
package (tracemalloc). No timing and no RSS figure is involved.
"""

from __future__ import annotations

import asyncio
import gc
import io
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
import orjson
import pytest

import gateway
from gateway.core.types import InferResponse, Tensor
from gateway.protocols.v2_grpc import codec
from gateway.protocols.v2_grpc.backend import STREAMED_MIN_BYTES
from peers.grpc_standin import GrpcStandin
from support import InProcessGateway

PACKAGE = Path(gateway.__file__).resolve().parent
PAYLOAD = np.arange(2 * STREAMED_MIN_BYTES // 4, dtype=np.float32).reshape(1, -1)  # 2 MiB: streamed
SIZE = PAYLOAD.nbytes
# How long the stand-in waits, at most, for the gateway to let go of the message.
LET_GO_WITHIN = 10.0


def held() -> set[str]:
    """``file:line`` of each gateway line whose allocation of the payload's
    size (or more) is still alive."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, f"{PACKAGE}/*")])
    return {f"{Path(frame.filename).relative_to(PACKAGE)}:{frame.lineno}"
            for trace in snapshot.traces if trace.size >= SIZE for frame in trace.traceback[:1]}


def echo(request: bytes) -> bytes:
    """The identity model: OUTPUT0 is INPUT0."""
    asked = codec.decode_infer_request(request, 1 << 30)
    (tensor,) = asked.inputs
    output = Tensor("OUTPUT0", tensor.datatype, tensor.shape, tensor.data)
    return codec.encode_infer_response(InferResponse(asked.model_name, asked.model_version, asked.id, [output]))


class WatchingUpstream(GrpcStandin):
    """Notes, for each call, what the gateway still held when the call
    arrived (``held_at_arrival``) and once it has had time to let the
    message go (``held_before_answer``; waited for when ``await_let_go``)."""

    def __init__(self, await_let_go: bool = True) -> None:
        super().__init__(echo)
        self.await_let_go = await_let_go
        self.held_at_arrival: list[set[str]] = []
        self.held_before_answer: list[set[str]] = []

    async def _infer(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.received.append(request)
        now = held()
        self.held_at_arrival.append(now)
        if self.await_let_go:  # the gateway drops its message once grpc reports it written
            deadline = asyncio.get_running_loop().time() + LET_GO_WITHIN
            while now and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
                now = held()
        self.held_before_answer.append(now)
        if self.failures:
            await context.abort(self.failures.pop(0), "the stand-in was told to fail")
        return self.reply(request)


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start(1)
    try:
        yield
    finally:
        tracemalloc.stop()


def config(upstream: GrpcStandin, route: str = "", mirror: GrpcStandin | None = None) -> str:
    shadow = f'\n  - {{name: shadow, protocol: v2-grpc, endpoints: ["{mirror.address}"]}}' if mirror else ""
    mirrors = "\n    mirror: [{upstream: shadow}]" if mirror else ""
    return f"""
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: up, protocol: v2-grpc, endpoints: ["{upstream.address}"]}}{shadow}
routes:
  - upstream: up{route}{mirrors}
"""


async def infer(gw: InProcessGateway) -> tuple[int, Any]:
    """tritonclient's binary form: JSON head, then the tensor's bytes."""
    head = orjson.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(PAYLOAD.shape),
                    "parameters": {"binary_data_size": SIZE}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]})
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}
    async with aiohttp.ClientSession() as session, session.post(
            f"{gw.url()}/v2/models/identity_fp32/infer", data=io.BytesIO(head + PAYLOAD.tobytes()), headers=headers,
            timeout=aiohttp.ClientTimeout(total=60)) as reply:
        body = await reply.read()
        if reply.status != 200:
            return reply.status, orjson.loads(body)
        length = int(reply.headers["Inference-Header-Content-Length"])
        return reply.status, np.frombuffer(body[length:], dtype=np.float32).reshape(PAYLOAD.shape)


async def test_body_and_message_are_let_go_while_the_upstream_works(traced: None) -> None:
    """Default retry policy (connect failures only): nothing of the request
    is held by the gateway's code once the upstream has the message."""
    async with WatchingUpstream() as upstream, InProcessGateway(config(upstream)) as gw:
        status, output = await infer(gw)
    assert status == 200 and np.array_equal(output, PAYLOAD)
    (arrival,), (answer,) = upstream.held_at_arrival, upstream.held_before_answer
    assert not any(where.startswith("http/") for where in arrival), f"the client's body was still held: {arrival}"
    assert answer == set(), f"still held while the upstream worked: {answer}"


async def test_a_retry_after_the_body_was_let_go_sends_the_first_message(traced: None) -> None:
    """A route that retries an answered try keeps the message (not the
    body): the retry sends the same bytes."""
    route = "\n    retry: {attempts: 2, retry_on: [unavailable], backoff: 0.001}"
    async with WatchingUpstream(await_let_go=False) as upstream, InProcessGateway(config(upstream, route)) as gw:
        upstream.failures.append(grpc.StatusCode.UNAVAILABLE)
        status, output = await infer(gw)
    assert status == 200 and np.array_equal(output, PAYLOAD)
    first, retry = upstream.received
    assert first == retry
    for seen in upstream.held_at_arrival:
        assert not any(where.startswith("http/") for where in seen), f"the client's body was still held: {seen}"


async def test_a_mirrored_request_keeps_its_tensors_for_the_mirror(traced: None) -> None:
    """A mirror encodes the inputs in a task of its own: they are not
    dropped under it, and it sends the same tensors."""
    async with WatchingUpstream(await_let_go=False) as upstream, GrpcStandin(echo) as shadow, \
            InProcessGateway(config(upstream, mirror=shadow)) as gw:
        status, output = await infer(gw)
        for _ in range(1000):  # the mirror is fire-and-forget
            if shadow.received:
                break
            await asyncio.sleep(0.01)
    assert status == 200 and np.array_equal(output, PAYLOAD)
    assert shadow.received == upstream.received
