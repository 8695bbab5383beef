"""One HTTP request and its reply as a handler sees them, whichever server
read the request: the fast protocol (gateway/transport/http_server/fast.py) or the aiohttp
application (gateway/transport/http_server/aiohttp_app.py). Hot handlers are written once against
these, so the two servers cannot answer one request differently."""

from __future__ import annotations

import abc
import re
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.record import (
    OUTCOME_OK,
    REQUEST_ID_HEADER,
    TRACEPARENT_HEADER,
    TRACESTATE_HEADER,
    accept_request_id,
    accept_traceparent,
    accept_tracestate,
)
from gateway.core.types import RequestContext
from gateway.runtime.budget import Reservation
from gateway.runtime.offload import Offloader

# Below this an answer is sent as it is: compressing costs more than it saves.
MIN_COMPRESSED_BYTES = 1024


class HttpStatusError(GatewayError):
    """A failure whose HTTP status is not its kind's (408, 417, 431);
    protocols without HTTP statuses of their own encode it by its kind."""

    def __init__(self, kind: ErrorKind, message: str, http_status: int) -> None:
        super().__init__(kind, message)
        self.http_status = http_status


def outcome_of_status(status: int, kinds: Mapping[int, ErrorKind]) -> str:
    """The outcome of an HTTP answer whose GatewayError no handler noted;
    ``kinds`` is the frontend's own table (its protocol's errors.py: what
    each of its statuses stands for)."""
    if status < 400:
        return OUTCOME_OK
    kind = kinds.get(status)
    if kind is None:
        kind = ErrorKind.MALFORMED_REQUEST if status < 500 else ErrorKind.INTERNAL
    return kind.value


def new_context(listener: str, protocol: str, headers: dict[str, str]) -> RequestContext:
    """A request's context from its headers (lower-case names): the
    client's request id and W3C trace context when they are well formed."""
    traceparent = accept_traceparent(headers.get(TRACEPARENT_HEADER))
    return RequestContext(listener=listener, protocol=protocol,
                          request_id=accept_request_id(headers.get(REQUEST_ID_HEADER)), headers=headers,
                          traceparent=traceparent,
                          tracestate=accept_tracestate(headers.get(TRACESTATE_HEADER), traceparent))


# llhttp's reasons for refusing a request are fixed texts ("Invalid method
# encountered"); anything else may quote what the client sent.
_PARSER_REASON = re.compile(r"[A-Za-z][A-Za-z0-9 ,./_'-]{0,80}")


def parser_reason(text: str) -> str | None:
    """A parser's reason for refusing a request, if it is one of its fixed
    texts (llhttp's message may go on with the offending bytes: cut)."""
    reason = text.split(":\n", 1)[0]  # llhttp via aiohttp: "<reason>:\n\n  b'<data>'\n  ^"
    return reason if _PARSER_REASON.fullmatch(reason) else None


class HttpRequest(abc.ABC):
    """A request whose head has been read; its body is read on demand, so a
    handler can refuse it (unknown model: 404) before any of it is read."""

    __slots__ = ("ctx", "headers", "method", "params", "path")

    method: str
    path: str  # percent-decoded, without the query
    params: Mapping[str, str]  # the route's path parameters ({model}, {version})
    headers: Mapping[str, str]  # lower-case names; a repeated header keeps its last value
    ctx: RequestContext

    @abc.abstractmethod
    def reservation(self) -> Reservation:
        """What this request holds of the memory budget (given back when it ends)."""

    @abc.abstractmethod
    async def read(self) -> bytes | bytearray:
        """The body, inflated, under the listener's size limit and body
        timeout, charged to the memory budget before it is buffered; one
        buffer, uncopied (tensor payloads decode as views of it)."""

    async def read_bytes(self) -> bytes:
        """:meth:`read` as immutable bytes (for JSON, hashing)."""
        body = await self.read()
        return body if isinstance(body, bytes) else bytes(body)


@dataclass(slots=True)
class HttpReply:
    """An answer: status, headers and the body in parts (tensors straight
    from their arrays, never joined into one more copy)."""

    status: int = 200
    parts: list[Any] = field(default_factory=list)  # bytes-like
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(memoryview(part).nbytes for part in self.parts)


Handler = Callable[[HttpRequest], Awaitable[HttpReply]]


def json_reply(body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> HttpReply:
    return HttpReply(status, [body], "application/json", headers if headers is not None else {})


def _compress(parts: list[Any], coding: str) -> bytes:
    compressor = zlib.compressobj(wbits=16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS)
    return b"".join([*(compressor.compress(part) for part in parts), compressor.flush()])


async def compress(reply: HttpReply, coding: str | None, offload: Offloader) -> HttpReply:
    """The reply in ``coding`` (gzip or deflate; None: as it is) when it is
    worth compressing; big answers are compressed in the offload pool."""
    size = reply.size
    if coding is None or size < MIN_COMPRESSED_BYTES:
        return reply
    reply.parts = [await offload.run(size, _compress, reply.parts, coding)]
    reply.headers["Content-Encoding"] = coding
    reply.headers["Vary"] = "Accept-Encoding"
    return reply
