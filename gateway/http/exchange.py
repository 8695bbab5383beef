"""One HTTP request and its reply as a handler sees them, whichever server
read the request: the fast protocol (gateway/http/fast.py) or the aiohttp
application (gateway/http/aiohttp_app.py). Hot handlers are written once against
these, so the two servers cannot answer one request differently."""

from __future__ import annotations

import abc
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.budget import Reservation
from gateway.errors import ErrorKind, GatewayError
from gateway.observe import OUTCOME_OK
from gateway.offload import Offloader
from gateway.types import RequestContext

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
