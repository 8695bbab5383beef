"""The upstream HTTP transport (gateway/transport/http_client/pool.py) over real sockets,
against raw HTTP servers in the test (every byte they write is chosen
here), on asyncio's loop and on uvloop (the gateway's)."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
import uvloop

from gateway.config.address import Address
from gateway.core.errors import CONNECT_FAILURE, CONNECTION_RESET, ErrorKind, GatewayError, UpstreamFailure
from gateway.runtime.tls import HttpClientTls
from gateway.transport.http_client.pool import UpstreamHttp

LIMIT = 1 << 20


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    factory = uvloop.new_event_loop if request.param == "uvloop" else asyncio.new_event_loop

    def runner(coroutine: Coroutine[Any, Any, Any]) -> Any:
        with asyncio.Runner(loop_factory=factory) as loop_runner:
            return loop_runner.run(asyncio.wait_for(coroutine, 20))

    return runner


def reply(body: bytes = b"ok", *extra: str, status: str = "200 OK", version: str = "HTTP/1.1") -> bytes:
    head = [f"{version} {status}", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


Answer = Callable[["RawServer", asyncio.StreamWriter, bytes, bytes], Awaitable[bool]]


async def answer_ok(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
    writer.write(reply(b"ok"))
    return True


class RawServer:
    """An HTTP/1.1 server that reads requests (Content-Length bodies) and
    lets ``answer`` write whatever it likes; returning False closes the
    connection. Counts connections and requests."""

    def __init__(self, answer: Answer = answer_ok) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.closed = asyncio.Event()  # set whenever a connection ends
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = Address("127.0.0.1", self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for writer in self._writers:
            writer.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def client(self, **options: Any) -> UpstreamHttp:
        options.setdefault("max_response", LIMIT)
        return UpstreamHttp(self.address, HttpClientTls(), "'up'", **options)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), 0)
                    body = await reader.readexactly(length)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                self.requests.append((head, body))
                if not await self.answer(self, writer, head, body):
                    break
                await writer.drain()
        finally:
            writer.close()
            self._writers.discard(writer)
            self.closed.set()


def failure(run: Callable[[Coroutine[Any, Any, Any]], Any], coroutine: Coroutine[Any, Any, Any]) -> GatewayError:
    async def catch() -> GatewayError:
        with pytest.raises(GatewayError) as info:
            await coroutine
        return info.value
    error: GatewayError = run(catch())
    return error


# --- the pool ----------------------------------------------------------------------------


def test_keep_alive_reuses_one_connection(run: Any) -> None:
    async def scenario() -> None:
        async with RawServer() as server:
            http = server.client(max_connections=4)
            for _ in range(5):
                answer = await http.request("GET", "/v2/health/ready", {"X-Request-Id": "r1"})
                assert (answer.status, bytes(answer.body)) == (200, b"ok")
            assert server.connections == 1 and len(server.requests) == 5
            assert http.open_connections == http.idle_connections == 1
            head = server.requests[0][0]
            assert head.startswith(b"GET /v2/health/ready HTTP/1.1\r\n")
            assert b"\r\nAccept-Encoding: identity\r\n" in head and b"\r\nX-Request-Id: r1\r\n" in head
            assert b"Content-Length" not in head  # a GET without a body says nothing of one
            await http.close()
    run(scenario())


def test_the_pool_is_bounded_and_waiters_get_connections_in_turn(run: Any) -> None:
    bound = 3

    async def scenario() -> None:
        release = asyncio.Event()

        async def slow(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            await release.wait()
            writer.write(reply(body))
            return True

        async with RawServer(slow) as server:
            http = server.client(max_connections=bound)
            calls = [asyncio.create_task(http.request("POST", "/", None, str(i).encode())) for i in range(bound + 1)]
            for _ in range(100):  # until every connection the pool may open is open
                await asyncio.sleep(0.01)
                if server.connections == bound:
                    break
            await asyncio.sleep(0.05)
            assert server.connections == bound and http.open_connections == bound
            release.set()
            answers = await asyncio.gather(*calls)
            assert sorted(bytes(a.body) for a in answers) == [str(i).encode() for i in range(bound + 1)]
            assert server.connections == bound  # the extra request waited for a connection, opened none
            await http.close()
    run(scenario())


def test_a_cancelled_waiter_leaves_the_pool_whole(run: Any) -> None:
    async def scenario() -> None:
        release = asyncio.Event()

        async def slow(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            await release.wait()
            writer.write(reply())
            return True

        async with RawServer(slow) as server:
            http = server.client(max_connections=1)
            busy = asyncio.create_task(http.request("GET", "/"))
            await asyncio.sleep(0.05)
            with pytest.raises(TimeoutError):  # the deadline ends the wait for a connection
                async with asyncio.timeout(0.05):
                    await http.request("GET", "/")
            release.set()
            assert (await busy).status == 200
            assert (await http.request("GET", "/")).status == 200
            assert server.connections == 1
            await http.close()
    run(scenario())


def test_idle_connections_are_closed_after_the_idle_timeout(run: Any) -> None:
    async def scenario() -> None:
        async with RawServer() as server:
            http = server.client(idle_timeout=0.1)
            await http.request("GET", "/")
            await asyncio.wait_for(server.closed.wait(), 2)  # the client closed it
            assert http.open_connections == 0
            await http.request("GET", "/")
            assert server.connections == 2
            await http.close()
    run(scenario())


# --- stale keep-alive --------------------------------------------------------------------


def test_a_connection_the_server_closed_while_idle_is_not_used(run: Any) -> None:
    """The server closes the idle connection and the loop has seen it."""
    async def scenario() -> None:
        async def once(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            writer.write(reply(body))  # no Connection: close, then it closes anyway
            return False

        async with RawServer(once) as server:
            http = server.client()
            await http.request("POST", "/", None, b"first")
            await asyncio.wait_for(server.closed.wait(), 2)
            await asyncio.sleep(0.05)
            assert (await http.request("POST", "/", None, b"second")).body == b"second"
            assert [body for _, body in server.requests] == [b"first", b"second"]  # each sent once
            assert server.connections == 2
            await http.close()
    run(scenario())


def test_a_close_the_loop_has_not_seen_yet_is_noticed_before_writing(run: Any) -> None:
    """The server's FIN is in the socket but the loop is busy (blocked
    here) and has not read it: the transport must not write the next
    request on that connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    first_closed = threading.Event()
    received: list[bytes] = []

    def serve() -> None:
        for index in range(2):
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(10)
                data = b""
                while b"\r\n\r\nbody" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                received.append(data)
                conn.sendall(reply(b"answer %d" % index))
            if index == 0:
                first_closed.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    async def scenario() -> None:
        http = UpstreamHttp(Address("127.0.0.1", listener.getsockname()[1]), HttpClientTls(), "'up'",
                            max_response=LIMIT)
        assert (await http.request("POST", "/", None, b"body")).body == b"answer 0"
        assert first_closed.wait(5)  # blocks the loop: it cannot see the close
        assert (await http.request("POST", "/", None, b"body")).body == b"answer 1"
        assert len(received) == 2  # the second request was sent once, on the new connection
        await http.close()

    try:
        run(scenario())
    finally:
        thread.join(5)
        listener.close()


def test_a_server_closing_mid_reply_is_a_reset_and_the_connection_is_dropped(run: Any) -> None:
    async def scenario() -> None:
        async def half(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
            return False

        async with RawServer(half) as server:
            http = server.client()
            with pytest.raises(UpstreamFailure) as info:
                await http.request("GET", "/")
            assert info.value.reason == CONNECTION_RESET and info.value.kind is ErrorKind.UPSTREAM_UNAVAILABLE
            assert "'up'" in info.value.message and "mid-reply" in info.value.message
            assert http.open_connections == http.idle_connections == 0
            await http.close()
    run(scenario())


def test_a_server_closing_without_answering_is_a_reset(run: Any) -> None:
    async def scenario() -> None:
        async def hang_up(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            return False

        async with RawServer(hang_up) as server:
            http = server.client()
            with pytest.raises(UpstreamFailure) as info:
                await http.request("POST", "/", None, b"x")
            assert info.value.reason == CONNECTION_RESET and "without answering" in info.value.message
            assert len(server.requests) == 1  # never sent twice: the route's retry policy decides
            await http.close()
    run(scenario())


def test_a_refused_connection_is_a_connect_failure_without_the_address(run: Any) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed

    async def scenario() -> None:
        http = UpstreamHttp(Address("127.0.0.1", port), HttpClientTls(), "'up'", max_response=LIMIT)
        with pytest.raises(UpstreamFailure) as info:
            await http.request("GET", "/")
        assert info.value.reason == CONNECT_FAILURE
        assert "127.0.0.1" not in info.value.message and str(port) not in info.value.message
        assert http.open_connections == 0
        await http.close()
    run(scenario())


# --- replies -----------------------------------------------------------------------------


def test_chunked_and_close_delimited_replies(run: Any) -> None:
    async def scenario() -> None:
        async def chunked(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            if body == b"chunked":
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Kind: Chunked\r\n\r\n"
                             b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\nTrailer: t\r\n\r\n")
                return True
            writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil the end")  # no length: the body ends with the connection
            return False

        async with RawServer(chunked) as server:
            http = server.client()
            answer = await http.request("POST", "/", None, b"chunked")
            assert (answer.status, bytes(answer.body), answer.headers.get("x-KIND")) == (200, b"hello world", "Chunked")
            answer = await http.request("POST", "/", None, b"close")  # on the same connection
            assert bytes(answer.body) == b"until the end"
            assert server.connections == 1 and http.open_connections == 0
            await http.close()
    run(scenario())


def test_connection_close_and_http_1_0_are_honoured(run: Any) -> None:
    async def scenario() -> None:
        async def closing(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            if body == b"close":
                writer.write(reply(body, "Connection: close"))
            else:
                writer.write(reply(body, version="HTTP/1.0"))
            return True  # the server would go on: the client must not

        async with RawServer(closing) as server:
            http = server.client()
            for body in (b"close", b"1.0", b"close"):
                assert (await http.request("POST", "/", None, body)).body == body
            assert server.connections == 3 and http.open_connections == 0
            await http.close()
    run(scenario())


def test_a_connection_is_not_reused_after_a_server_error(run: Any) -> None:
    """A server that closes silently after its 500 (uvicorn under KServe
    does): the next request must not be written onto that connection."""
    async def scenario() -> None:
        async def failing(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            if body == b"fail":
                writer.write(reply(b"oops", status="500 Internal Server Error"))
                await writer.drain()
                await asyncio.sleep(0.05)  # closes a little later, as a busy server does
                return False
            writer.write(reply(body))
            return True

        async with RawServer(failing) as server:
            http = server.client()
            assert (await http.request("POST", "/", None, b"fail")).status == 500
            assert (await http.request("POST", "/", None, b"next")).body == b"next"  # no reset
            assert server.connections == 2 and http.idle_connections == 1
            await http.close()
    run(scenario())


def test_keepalive_false_asks_for_close(run: Any) -> None:
    async def scenario() -> None:
        async with RawServer() as server:
            http = server.client(keepalive=False)
            for _ in range(2):
                assert (await http.request("GET", "/")).status == 200
            assert server.connections == 2 and all(b"\r\nConnection: close\r\n" in h for h, _ in server.requests)
            await http.close()
    run(scenario())


@pytest.mark.parametrize("framing", ["declared", "chunked", "until-close"])
def test_a_reply_over_the_limit_is_refused(run: Any, framing: str) -> None:
    big = b"x" * 5000

    async def scenario() -> None:
        async def large(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            if framing == "declared":
                writer.write(reply(big))
            elif framing == "chunked":
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                for _ in range(10):
                    writer.write(b"3e8\r\n" + big[:1000] + b"\r\n")
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + big)
                return False
            return True

        async with RawServer(large) as server:
            http = server.client(max_response=4096)
            with pytest.raises(GatewayError) as info:
                await http.request("GET", "/")
            assert info.value.kind is ErrorKind.UPSTREAM_BAD_RESPONSE
            assert "over max_response_bytes 4096" in info.value.message
            assert http.open_connections == 0
            await http.close()
    run(scenario())


@pytest.mark.parametrize("garbage", [
    b"\x00\x01\x02 secret-token-123 not HTTP\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: secret-token-123\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 secret-token-123",  # bytes after the reply
])
def test_garbage_is_a_bad_response_that_does_not_echo_it(run: Any, garbage: bytes) -> None:
    async def scenario() -> None:
        async def junk(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            writer.write(garbage)
            return True

        async with RawServer(junk) as server:
            http = server.client()
            try:
                answer = await http.request("GET", "/")
            except GatewayError as error:
                assert error.kind is ErrorKind.UPSTREAM_BAD_RESPONSE and "unreadable HTTP reply" in error.message
                assert "secret" not in error.message
            else:  # a good reply followed by junk: the reply stands, the connection goes
                assert bytes(answer.body) == b"ok"
                await asyncio.sleep(0.05)
            assert http.open_connections == 0
            await http.close()
    run(scenario())


def test_interim_replies_are_skipped_and_compressed_ones_refused(run: Any) -> None:
    async def scenario() -> None:
        async def odd(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            if body == b"interim":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + reply(b"final"))
            else:
                writer.write(reply(b"\x1f\x8b...", "Content-Encoding: gzip"))
            return True

        async with RawServer(odd) as server:
            http = server.client()
            assert (await http.request("POST", "/", None, b"interim")).body == b"final"
            with pytest.raises(GatewayError, match="compressed") as info:
                await http.request("POST", "/", None, b"gzip")
            assert info.value.kind is ErrorKind.UPSTREAM_BAD_RESPONSE
            await http.close()
    run(scenario())


# --- requests ----------------------------------------------------------------------------


def test_big_bodies_in_parts_arrive_whole(run: Any) -> None:
    parts = [b"head", bytearray(b"a" * (3 << 20)), memoryview(b"b" * ((1 << 20) + 7))]
    digest = hashlib.sha256(b"".join(bytes(p) for p in parts)).hexdigest().encode()

    async def scenario() -> None:
        async def echo(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            writer.write(reply(hashlib.sha256(body).hexdigest().encode() + b" " + body))
            return True

        async with RawServer(echo) as server:
            http = server.client(max_response=8 << 20)
            answer = await http.request("POST", "/", {"Content-Type": "application/octet-stream"}, parts)
            assert bytes(answer.body[:64]) == digest and len(answer.body) == 65 + sum(len(p) for p in parts)
            await http.close()
    run(scenario())


def test_an_answer_before_the_body_is_read_stops_the_writing(run: Any) -> None:
    """The server answers (413) after the head and reads no more: the
    client, paused by backpressure, takes the answer and drops the connection."""
    async def scenario() -> None:
        done = asyncio.Event()

        async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(reply(b"too big", status="413 Payload Too Large"))
            await done.wait()
            writer.close()

        server = await asyncio.start_server(refuse, "127.0.0.1", 0)
        http = UpstreamHttp(Address("127.0.0.1", server.sockets[0].getsockname()[1]), HttpClientTls(), "'up'",
                            max_response=LIMIT)
        answer = await http.request("POST", "/", None, bytes(16 << 20))  # beyond what loopback buffers hold
        assert (answer.status, answer.body) == (413, b"too big")
        assert http.open_connections == 0
        done.set()
        await http.close()
        server.close()
        await server.wait_closed()
    run(scenario())


def test_a_line_break_in_a_header_is_refused_before_anything_is_sent(run: Any) -> None:
    async def scenario() -> None:
        async with RawServer() as server:
            http = server.client()
            with pytest.raises(GatewayError) as info:
                await http.request("GET", "/", {"X-Id": "a\r\nX-Injected: 1"})
            assert info.value.kind is ErrorKind.INVALID_INPUT
            assert server.connections == 0
            await http.close()
    run(scenario())


def test_cancelling_a_request_closes_its_connection(run: Any) -> None:
    async def scenario() -> None:
        async def silent(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            return True  # no answer; the server reads on, and sees the end of the connection

        async with RawServer(silent) as server:
            http = server.client()
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await http.request("GET", "/")
            assert http.open_connections == 0
            await asyncio.wait_for(server.closed.wait(), 2)  # the server saw the connection go
            await http.close()
    run(scenario())


# --- streamed replies (UpstreamHttp.stream) ------------------------------------------------


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def test_a_streamed_reply_comes_piece_by_piece_and_its_connection_is_reused(run: Any) -> None:
    async def scenario() -> None:
        more = asyncio.Event()

        async def events(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
                         + chunk(b"first"))
            await writer.drain()
            await more.wait()  # the second piece is written only once the first was read
            writer.write(chunk(b"second") + b"0\r\n\r\n")
            return True

        async with RawServer(events) as server:
            http = server.client()
            stream = await http.stream("POST", "/infer_stream", None, b"{}")
            assert (stream.status, stream.headers.get("content-type")) == (200, "text/event-stream")
            assert await stream.read() == b"first"
            more.set()
            assert await stream.read() == b"second"
            assert await stream.read() is None
            stream.close()
            assert http.idle_connections == 1  # read to its end: back to the pool
            more.clear()
            more.set()
            stream = await http.stream("POST", "/infer_stream", None, b"{}")
            assert await stream.read_all(1 << 20) == b"firstsecond"
            stream.close()
            assert server.connections == 1
            await http.close()
    run(scenario())


def test_a_stream_reader_that_stops_stops_the_server(run: Any) -> None:
    """The server writes 32 MiB as fast as the socket takes it: while the
    client reads nothing, the server is soon held up (only the buffer and
    the sockets' own buffers fill); then everything arrives."""
    piece, total = 64 << 10, 32 << 20

    async def scenario() -> None:
        written = [0]

        async def flood(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            data = chunk(b"x" * piece)
            while written[0] < total:
                writer.write(data)
                await writer.drain()
                written[0] += piece
            writer.write(b"0\r\n\r\n")
            return True

        async with RawServer(flood) as server:
            http = server.client()
            stream = await http.stream("GET", "/", buffer_bytes=piece)
            seen = [-1]
            for _ in range(100):  # until the server stops making progress
                await asyncio.sleep(0.1)
                if written[0] == seen[-1]:
                    break
                seen.append(written[0])
            assert written[0] < total // 2
            received = 0
            while (data := await stream.read()) is not None:
                received += len(data)
            assert received == total
            stream.close()
            await http.close()
    run(scenario())


def test_a_stream_closed_early_drops_its_connection_and_a_cut_one_is_a_reset(run: Any) -> None:
    async def scenario() -> None:
        async def cut(server: RawServer, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> bool:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"part"))
            return body != b"cut"  # "cut": closes mid-reply; else waits (unfinished) for the client to go

        async with RawServer(cut) as server:
            http = server.client()
            stream = await http.stream("POST", "/", None, b"leave")
            assert await stream.read() == b"part"
            stream.close()  # the body is not read to its end: the connection cannot be reused
            await asyncio.wait_for(server.closed.wait(), 5)
            assert http.open_connections == 0
            stream = await http.stream("POST", "/", None, b"cut")
            assert await stream.read() == b"part"
            with pytest.raises(UpstreamFailure) as info:
                await stream.read()
            assert info.value.reason == CONNECTION_RESET and "mid-reply" in info.value.message
            stream.close()
            assert http.open_connections == 0
            await http.close()
    run(scenario())
