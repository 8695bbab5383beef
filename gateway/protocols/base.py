"""The two contracts a protocol adapter implements, and what a frontend
may ask of the data plane.

A *frontend* owns one listener: it decodes its wire format into canonical
requests, hands them to the data plane (:class:`DataPlaneApi`, which
gateway.dataplane.plane.DataPlane implements) and encodes the answers (or errors)
back. An *upstream client* talks to one endpoint of an upstream cluster in
that upstream's protocol. Nothing here imports the data plane or the
server: they import this.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gateway.config.auth import AUTHORIZATION
from gateway.config.node import Node
from gateway.config.tls import CLIENT_AUTH_MODES
from gateway.core.contracts import StreamedResponse
from gateway.core.errors import unsupported
from gateway.core.types import InferRequest, InferResponse, ModelMetadata, OperationRequest, RequestContext
from gateway.runtime.auth import Authenticator, credential_headers
from gateway.runtime.tls import ServerTls

if TYPE_CHECKING:
    from gateway.config.address import Address
    from gateway.config.listeners import ListenerConfig
    from gateway.config.model import GatewayConfig
    from gateway.config.upstreams import UpstreamConfig
    from gateway.dataplane.routing import Route, RouteTable
    from gateway.runtime.services import GatewayServices


class DataPlaneApi(Protocol):
    """The data plane as frontends see it (gateway/dataplane/plane.py has the policy:
    routing, rewrites, retries, mirrors)."""

    draining: bool  # set while the gateway drains: answers ask clients to close

    @property
    def config(self) -> GatewayConfig: ...

    @property
    def routes(self) -> RouteTable: ...

    def resolve(self, model: str, version: str, ctx: RequestContext) -> Route:
        """The route for a request whose body is not read yet (MODEL_NOT_FOUND now if none)."""

    def offers(self, route: Route, operation: str) -> bool:
        """Whether every upstream of ``route`` answers ``operation`` (call_operation)."""

    def relays(self, route: Route, protocol: str) -> bool:
        """Whether an upstream of ``route`` speaks ``protocol`` and takes a
        client's bytes unchanged (its ``passthrough`` on)."""

    def relays_only(self, route: Route, protocol: str) -> bool:
        """Whether every upstream of ``route`` does (whichever a split picks,
        it takes bytes no other protocol could read)."""

    async def infer(self, request: InferRequest, ctx: RequestContext) -> InferResponse: ...

    async def infer_stream(self, request: InferRequest, ctx: RequestContext,
                           deliver: Callable[[StreamedResponse], Awaitable[None]]) -> None:
        """``infer`` for a stream: each response goes to ``deliver`` as it
        comes, awaited (a slow reader slows the upstream)."""

    async def model_metadata(self, model: str, version: str, ctx: RequestContext) -> ModelMetadata: ...

    async def model_ready(self, model: str, version: str, ctx: RequestContext) -> bool: ...

    async def server_ready(self, ctx: RequestContext) -> bool: ...

    async def list_models(self, ctx: RequestContext) -> list[str]: ...

    async def call_operation(self, operation: str, request: InferRequest, ctx: RequestContext,
                             arguments: Any = None) -> Any: ...


class Frontend(abc.ABC):
    """A listener speaking one downstream protocol."""

    # The listener `tls.client_auth` modes its server library can offer.
    TLS_CLIENT_AUTH_MODES: tuple[str, ...] = CLIENT_AUTH_MODES

    def __init__(self, listener: ListenerConfig, dataplane: DataPlaneApi, services: GatewayServices) -> None:
        self.listener = listener
        self.dataplane = dataplane
        self.services = services

    @classmethod
    def parse_options(cls, node: Node) -> Any:
        """Read this protocol's own listener keys from ``node``."""
        return None

    @classmethod
    def parse_route_options(cls, node: Node, base_dir: Path) -> Any:
        """Read a route's ``options.<protocol>`` block; relative paths in it
        resolve against ``base_dir`` (the config file's folder)."""
        return node.value

    @property
    @abc.abstractmethod
    def bound_port(self) -> int:
        """The port actually bound (useful when the config says port 0)."""

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def stop(self, grace: float) -> None:
        """Stop accepting, let in-flight requests finish within ``grace`` s."""

    # The listener's TLS material and token checker, when it has them: set at start.
    _tls: ServerTls | None = None
    _authenticator: Authenticator | None = None

    def reload_security(self, listener: ListenerConfig) -> None:
        """Re-read this listener's certificate and token files (for a
        reload that keeps the listener running); raises OSError/ssl.SSLError
        and keeps the old material when they cannot be read."""
        if self._tls is not None and listener.tls is not None:
            self._tls.reload(listener.tls)
        if self._authenticator is not None and listener.auth is not None:
            self._authenticator.reload(listener.auth)


class UpstreamClient(abc.ABC):
    """Speaks an upstream's protocol to one endpoint (or in-process); a
    gateway.core.contracts.Backend, the data plane's view of it."""

    # Operations call_operation answers (names in gateway.core.types); callers
    # ask DataPlane.offers before promising them to a client.
    operations: frozenset[str] = frozenset()

    def __init__(self, upstream: UpstreamConfig, endpoint: Address | None, services: GatewayServices) -> None:
        self.upstream = upstream
        self.endpoint = endpoint
        self.services = services
        # The upstream's own credential header (`auth:`), read when built.
        self.credentials = credential_headers(upstream.auth)

    def request_headers(self, ctx: RequestContext | None) -> dict[str, str]:
        """Headers (or gRPC metadata) for one call: request id and trace
        context, the client's Authorization when its route forwards it, and
        this upstream's own credential, which wins over a forwarded one."""
        headers = ctx.upstream_headers() if ctx is not None else {}
        if ctx is not None and ctx.forward_authorization and AUTHORIZATION in ctx.headers:
            headers[AUTHORIZATION] = ctx.headers[AUTHORIZATION]
        headers.update(self.credentials)
        return headers

    @classmethod
    def parse_options(cls, node: Node) -> Any:
        """Read this protocol's own upstream keys from ``node``."""
        return None

    @classmethod
    def needs_endpoints(cls) -> bool:
        return True

    @property
    def label(self) -> str:
        """How errors name this endpoint: by its upstream's name alone, as
        clients may see them; addresses go to logs only (endpoint_label)."""
        return self.upstream.name

    @property
    def endpoint_label(self) -> str:
        """How logs name this endpoint: its upstream and its address."""
        return f"{self.upstream.name}" + (f" ({self.endpoint})" if self.endpoint else "")

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open pools or channels; called once before the first request."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; called once at shutdown or after reload."""

    @abc.abstractmethod
    async def infer(self, request: InferRequest, ctx: RequestContext) -> InferResponse: ...

    async def infer_stream(self, request: InferRequest, ctx: RequestContext) -> AsyncIterator[StreamedResponse]:
        """The responses to one request as they come: zero or more (a
        decoupled model). The default, for upstreams with one answer per
        request: that answer, final."""
        yield StreamedResponse(await self.infer(request, ctx), final=True)

    @abc.abstractmethod
    async def model_metadata(self, model: str, version: str, ctx: RequestContext) -> ModelMetadata: ...

    @abc.abstractmethod
    async def model_ready(self, model: str, version: str, ctx: RequestContext) -> bool: ...

    @abc.abstractmethod
    async def server_ready(self, ctx: RequestContext) -> bool: ...

    def knows_model(self, model: str, version: str) -> bool | None:
        """Whether this upstream serves ``model``, when it can tell without a
        call (in-process upstreams); None otherwise. Lets a frontend answer
        "model not found" before it reads a body meant for no model."""
        return None

    def check_request(self, request: InferRequest) -> None:  # noqa: B027 - optional hook
        """Raise the error this upstream would answer ``request`` with, when
        it can tell without a call or reading values (an in-process model's
        declared inputs); the default cannot tell. Asked before a request
        joins a batch, so that it never joins one it would fail."""

    async def list_models(self, ctx: RequestContext) -> list[str]:
        """Models this upstream can name itself; empty when it cannot list."""
        return []

    async def health_check(self, ctx: RequestContext) -> bool:
        """The active health check of this endpoint (``health_check`` in the
        upstream config). The default asks the server whether it is ready;
        protocols override it with their own cheap probe (e.g. UM-Bridge
        /Info, GraphStorm /ping). ``ctx.deadline`` bounds the call."""
        return await self.server_ready(ctx)

    async def call_operation(self, operation: str, request: OperationRequest, ctx: RequestContext) -> Any:
        """Protocol-specific operations (e.g. UM-Bridge derivatives)."""
        raise unsupported(f"upstream '{self.upstream.name}' does not support {operation}")
