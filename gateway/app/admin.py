"""The admin listener (loopback by default): liveness, readiness, metrics,
effective config and route table.

Every method other than GET/HEAD (write endpoints such as a reload) needs
``admin.token`` as a bearer token when one is configured, and is refused
outright when the admin address is not loopback and no token is set.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from gateway.config.address import Address
from gateway.config.auth import CredentialConfig
from gateway.config.model import GatewayConfig
from gateway.config.server import AdminConfig
from gateway.config.view import effective_config
from gateway.core.errors import GatewayError
from gateway.core.types import RequestContext
from gateway.dataplane.plane import DataPlane
from gateway.observability.counters import Counters
from gateway.observability.metrics import render_settled
from gateway.runtime.auth import Authenticator
from gateway.runtime.services import GatewayServices
from gateway.transport.http_server.body import accepted_coding


@dataclass(frozen=True)
class ReloadResult:
    """How a reload went (POST /reload answers it)."""

    ok: bool
    problems: tuple[str, ...] = ()
    source: str = ""


class Administered(Protocol):
    """What the admin listener reads and drives (gateway.app.server.Gateway,
    which hands itself over: the admin never imports the server)."""

    config: GatewayConfig
    services: GatewayServices
    counters: Counters
    dataplane: DataPlane

    async def reload(self) -> ReloadResult:
        """Re-read the configuration."""


log = logging.getLogger(__name__)
GATEWAY: web.AppKey[Administered] = web.AppKey("gateway")
# The admin token's checker, when admin.token is set (re-read on reload).
ADMIN_AUTH = web.AppKey("admin_auth", Authenticator)
READ_METHODS = frozenset({"GET", "HEAD"})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_exposed(admin: AdminConfig) -> bool:
    """Whether the admin listener is reachable from other hosts."""
    return admin.address is not None and not is_loopback(admin.address.host)


def write_guard(admin: AdminConfig, authenticator: Authenticator | None
                ) -> Callable[..., Awaitable[web.StreamResponse]]:
    exposed = is_exposed(admin)

    @web.middleware
    async def guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        if request.method not in READ_METHODS:
            if authenticator is not None:
                try:
                    authenticator.check(request.headers)
                except GatewayError as error:
                    return web.json_response({"error": error.message}, status=401,
                                             headers={"WWW-Authenticate": authenticator.challenge})
            elif exposed:
                return web.json_response({"error": "admin write endpoints need admin.token when the admin "
                                                   "address is not loopback"}, status=403)
        return await handler(request)

    return guard


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"live": True})


async def readyz(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    ready = await gateway.dataplane.server_ready(RequestContext("admin", "admin"))
    return web.json_response({"ready": ready}, status=200 if ready else 503)


async def routes(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    return web.json_response({"routes": gateway.dataplane.routes.describe()})


async def metrics(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body, content_type = await render_settled(gateway.services.metrics,
                                              request.headers.get("Accept", ""))
    response = web.Response(body=body, headers={"Content-Type": content_type})
    if accepted_coding(request.headers.get("Accept-Encoding", ""), ("gzip",)) == "gzip":
        response.enable_compression(web.ContentCoding.gzip)
    return response


async def config(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    return web.json_response(effective_config(gateway.config))


async def index(request: web.Request) -> web.Response:
    paths = sorted({r.canonical for r in request.app.router.resources()})
    return web.json_response({"endpoints": paths})


async def upstreams(request: web.Request) -> web.Response:
    """Every upstream with its endpoints: health, ejection, in flight, counters."""
    gateway = request.app[GATEWAY]
    clusters = gateway.dataplane.clusters.values()
    return web.json_response({"upstreams": [cluster.snapshot() for cluster in clusters]})


async def reload(request: web.Request) -> web.Response:
    """Re-read the configuration file; 200 when applied, 400 with the problems
    (each with its YAML path) when rejected. Loopback clients only, unless
    ``admin.allow_remote_reload``."""
    gateway = request.app[GATEWAY]
    client = (request.remote or "").split("%")[0]  # drop an IPv6 zone
    if not (is_loopback(client) or gateway.config.admin.allow_remote_reload):
        return web.json_response({"error": "reload is only allowed from loopback (admin.allow_remote_reload)"},
                                 status=403)
    result = await gateway.reload()
    body = {"reloaded": result.ok, "source": result.source, "problems": list(result.problems)}
    return web.json_response(body, status=200 if result.ok else 400)


async def reload_status(request: web.Request) -> web.Response:
    """How reloads went: counts, last success and failure (Unix times), last error."""
    gateway = request.app[GATEWAY]
    return web.json_response(dataclasses.asdict(gateway.counters.reload))


def build_admin_app(gateway: Administered) -> web.Application:
    admin = gateway.config.admin
    authenticator = Authenticator(CredentialConfig(admin.token)) if admin.token is not None else None
    app = web.Application(middlewares=[write_guard(admin, authenticator)])
    app[GATEWAY] = gateway
    if authenticator is not None:
        app[ADMIN_AUTH] = authenticator
    app.router.add_get("/", index)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/routes", routes)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/config", config)
    app.router.add_get("/upstreams", upstreams)
    app.router.add_post("/reload", reload)
    app.router.add_get("/reload", reload_status)
    return app


async def start_admin(gateway: Administered, address: Address) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(build_admin_app(gateway), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, address.host, address.port, reuse_address=True,
                       reuse_port=gateway.services.reuse_port or None)
    await site.start()
    bound = runner.addresses
    port = bound[0][1] if bound else address.port
    log.info("admin on %s:%d", address.host, port)
    if not is_loopback(address.host):
        log.warning("the admin listener on %s is reachable from other hosts: /config and /metrics are "
                    "unauthenticated; write endpoints %s", address,
                    "need admin.token" if gateway.config.admin.token else "are refused (no admin.token)")
    return runner, port
