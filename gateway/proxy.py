"""The data plane: route a canonical request to a cluster and back.

Frontends call :class:`DataPlane`; it resolves the route, applies the
route's rewrite and timeout, picks an endpoint of the cluster, calls its
upstream client and hands back canonical answers named as the client asked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gateway.config import GatewayConfig, UpstreamConfig
from gateway.errors import ErrorKind, GatewayError, invalid, model_not_found
from gateway.extensions.statistics import batch_size
from gateway.metrics import metrics_of
from gateway.protocols import registry
from gateway.protocols.base import UpstreamClient
from gateway.routing import Route, RouteTable
from gateway.types import ExtensionRequest, InferRequest, InferResponse, ModelMetadata, RequestContext

log = logging.getLogger(__name__)
T = TypeVar("T")


class Cluster:
    """An upstream's endpoints, each with its own protocol client."""

    def __init__(self, config: UpstreamConfig, services: Any) -> None:
        self.config = config
        client_class = registry.load(config.protocol, "backend")
        endpoints = config.endpoints if client_class.needs_endpoints() else (None,)
        if not endpoints:
            raise GatewayError(ErrorKind.INTERNAL, f"upstream '{config.name}' has no endpoints")
        self.clients: list[UpstreamClient] = [client_class(config, ep, services) for ep in endpoints]
        self._next = itertools.cycle(range(len(self.clients)))

    def pick(self) -> UpstreamClient:
        return self.clients[next(self._next)]

    async def start(self) -> None:
        for client in self.clients:
            await client.start()

    async def close(self) -> None:
        await asyncio.gather(*(client.close() for client in self.clients), return_exceptions=True)


class DataPlane:
    def __init__(self, config: GatewayConfig, services: Any) -> None:
        self.config = config
        self.routes = RouteTable(config)
        self.clusters = {u.name: Cluster(u, services) for u in config.upstreams}
        self.draining = False
        self.metrics = metrics_of(services)

    async def start(self) -> None:
        for cluster in self.clusters.values():
            await cluster.start()

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.clusters.values()))

    # --- routing --------------------------------------------------------

    def resolve(self, model: str, version: str, ctx: RequestContext) -> Route:
        route = self.routes.resolve(model, version, ctx.listener, ctx.protocol, ctx.headers)
        ctx.record.model, ctx.record.version = model, version  # observability (issue 7)
        if route is None:
            raise model_not_found(model, version)
        ctx.record.route, ctx.record.upstream = str(route.index), route.upstream
        return route

    def _target(self, route: Route, model: str, version: str) -> tuple[str, str]:
        rewrite = route.config.rewrite
        return rewrite.model or model, rewrite.version if rewrite.version is not None else version

    async def _call(self, route: Route, ctx: RequestContext, call: Callable[[UpstreamClient], Awaitable[T]]) -> T:
        cluster = self.clusters[route.upstream]
        client = cluster.pick()
        timeout = route.config.timeout if route.config.timeout is not None else cluster.config.timeout
        remaining = ctx.remaining()
        if remaining is not None:
            timeout = remaining if timeout is None else min(timeout, remaining)
        if timeout is not None:  # upstream clients pass the remaining time on (e.g. as a gRPC deadline)
            ctx.deadline = time.monotonic() + timeout
        try:
            # One measured upstream attempt (issue 7); outside the timeout so it sees TimeoutError.
            with self.metrics.upstream_call(ctx.record, route.upstream, str(client.endpoint or "")):
                if timeout is None:
                    return await call(client)
                async with asyncio.timeout(timeout):
                    return await call(client)
        except TimeoutError:
            raise GatewayError(ErrorKind.UPSTREAM_TIMEOUT,
                               f"upstream {client.label} did not answer within {timeout:.2f}s") from None
        except GatewayError:
            raise
        except Exception as exc:  # a bug in a client: never leak a traceback to the wire
            log.exception("upstream client %s failed", client.label)
            raise GatewayError(ErrorKind.INTERNAL, f"internal error calling upstream {client.label}: "
                               f"{type(exc).__name__}") from exc

    # --- operations -------------------------------------------------------

    async def infer(self, request: InferRequest, ctx: RequestContext) -> InferResponse:
        asked_model, asked_version = request.model_name, request.model_version
        route = self.resolve(asked_model, asked_version, ctx)
        ctx.record.batch_size = batch_size(request.inputs)  # a routed inference, for the statistics
        model, version = self._target(route, asked_model, asked_version)
        upstream_request = dataclasses.replace(request, model_name=model, model_version=version)
        response = await self._call(route, ctx, lambda c: c.infer(upstream_request, ctx))
        response.model_name = asked_model
        if route.config.rewrite.version is not None:
            response.model_version = asked_version
        if not response.id:
            response.id = request.id
        if request.outputs:
            response.outputs = select_outputs(response, request, asked_model)
        return response

    async def model_metadata(self, model: str, version: str, ctx: RequestContext) -> ModelMetadata:
        route = self.resolve(model, version, ctx)
        target, target_version = self._target(route, model, version)
        metadata = await self._call(route, ctx, lambda c: c.model_metadata(target, target_version, ctx))
        if route.config.rewrite.version is not None:
            return dataclasses.replace(metadata, name=model, versions=(version,) if version else ())
        return dataclasses.replace(metadata, name=model)

    async def model_ready(self, model: str, version: str, ctx: RequestContext) -> bool:
        route = self.resolve(model, version, ctx)
        target, target_version = self._target(route, model, version)
        return await self._call(route, ctx, lambda c: c.model_ready(target, target_version, ctx))

    async def server_ready(self, ctx: RequestContext) -> bool:
        return not self.draining

    async def list_models(self, ctx: RequestContext) -> list[str]:
        """Models reachable from ``ctx.listener``: explicit route names plus
        what upstreams behind catch-all routes can list themselves."""
        names = self.routes.explicit_models(ctx.listener)
        for route in self.routes.routes:
            m = route.config.match
            if m.listener not in (None, ctx.listener) or m.model.kind == "exact":
                continue
            try:
                listed = await self._call(route, ctx, lambda c: c.list_models(ctx))
            except GatewayError:
                continue
            names += [n for n in listed if n not in names and route.matches(
                n, "", ctx.listener, ctx.protocol, ctx.headers)]
        return names

    async def call_extension(self, operation: str, request: InferRequest, ctx: RequestContext,
                             arguments: Any = None) -> Any:
        """An operation beyond infer (e.g. ``DERIVATIVE_OPERATION``), routed and
        rewritten exactly like infer; the upstream client's ``call_extension``
        answers it or raises UNSUPPORTED."""
        route = self.resolve(request.model_name, request.model_version, ctx)
        model, version = self._target(route, request.model_name, request.model_version)
        routed = ExtensionRequest(dataclasses.replace(request, model_name=model, model_version=version), arguments)
        return await self._call(route, ctx, lambda c: c.call_extension(operation, routed, ctx))


def select_outputs(response: InferResponse, request: InferRequest, model: str) -> list[Any]:
    """The requested outputs, in the order asked; unknown names are errors."""
    by_name = {t.name: t for t in response.outputs}
    selected = []
    for wanted in request.outputs:
        tensor = by_name.get(wanted.name)
        if tensor is None:
            raise invalid(f"unexpected inference output '{wanted.name}' for model '{model}'")
        selected.append(tensor)
    return selected
