"""Start and stop the whole gateway: data plane, listeners, admin."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway import __version__
from gateway.accesslog import AccessLog
from gateway.admin import start_admin
from gateway.config import GatewayConfig, ServerIdentity
from gateway.extensions.statistics import StatisticsStore
from gateway.metrics import GatewayMetrics
from gateway.protocols import registry
from gateway.protocols.base import Frontend
from gateway.proxy import DataPlane
from gateway.tracing import Tracing

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GatewayServices:
    """What listeners and upstream clients share; passed in, never global."""

    config: GatewayConfig
    identity: ServerIdentity
    metrics: GatewayMetrics = field(default_factory=lambda: GatewayMetrics(CollectorRegistry(auto_describe=False)))
    access_log: AccessLog = field(default_factory=lambda: AccessLog(None))
    # True under `gateway serve --workers N`: listeners bind with SO_REUSEPORT
    # (HTTP: TCPSite(reuse_port=True); gRPC: option ("grpc.so_reuseport", 1),
    # and ("grpc.so_reuseport", 0) otherwise, since grpc defaults it on).
    reuse_port: bool = False
    worker: int | None = None  # worker index under a supervisor
    tracing: Tracing | None = None  # OpenTelemetry, when observability.tracing.enabled
    # Triton-style per-model statistics, fed by finish_request like the metrics.
    statistics: StatisticsStore = field(default_factory=StatisticsStore)


def build_metrics(config: GatewayConfig, version: str, registry: CollectorRegistry | None = None,
                  multiprocess_dir: str | None = None) -> GatewayMetrics:
    known = [r.match.model.pattern for r in config.routes if r.match.model.kind == "exact"]
    metrics = GatewayMetrics(registry or CollectorRegistry(auto_describe=False), version=version,
                             max_model_labels=config.observability.metrics.max_model_labels,
                             known_models=known, multiprocess_dir=multiprocess_dir)
    for upstream in config.upstreams:
        metrics.declare_upstream(upstream.name, [str(e) for e in upstream.endpoints])
    metrics.record_config_loaded()
    return metrics


class Gateway:
    def __init__(self, config: GatewayConfig, registry: CollectorRegistry | None = None, *,
                 worker: int | None = None, multiprocess_dir: str | None = None) -> None:
        self.config = config
        version = config.server.version or __version__
        self.services = GatewayServices(
            config, ServerIdentity(config.server.name, version, config.server.extensions),
            metrics=build_metrics(config, version, registry, multiprocess_dir),
            access_log=AccessLog.open(config.observability.access_log, worker),
            reuse_port=worker is not None, worker=worker,
            tracing=Tracing(config.observability.tracing, version, worker)
            if config.observability.tracing.enabled else None,
            statistics=StatisticsStore(config.observability.metrics.max_model_labels))
        self.dataplane = DataPlane(config, self.services)
        self.frontends: dict[str, Frontend] = {}
        self._admin: web.AppRunner | None = None
        self.admin_port = 0
        self._stopped = asyncio.Event()

    @property
    def ports(self) -> dict[str, int]:
        ports = {name: fe.bound_port for name, fe in self.frontends.items()}
        if self._admin is not None:
            ports["admin"] = self.admin_port
        return ports

    async def start(self) -> None:
        await self.dataplane.start()
        for listener in self.config.listeners:
            frontend_class = registry.load(listener.protocol, "frontend")
            frontend = frontend_class(listener, self.dataplane, self.services)
            await frontend.start()
            self.frontends[listener.name] = frontend
        if self.config.admin.address is not None:
            self._admin, self.admin_port = await start_admin(self, self.config.admin.address)

    async def stop(self, grace: float = 5.0) -> None:
        self.dataplane.draining = True
        await asyncio.gather(*(fe.stop(grace) for fe in self.frontends.values()))
        if self._admin is not None:
            await self._admin.cleanup()
            self._admin = None
        await self.dataplane.close()
        self.services.access_log.close()
        if self.services.tracing is not None:
            self.services.tracing.close()
        self._stopped.set()

    async def run_until_signalled(self) -> None:
        loop = asyncio.get_running_loop()
        stop_requested = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop_requested.set)
        await stop_requested.wait()
        log.info("stopping")
        await self.stop()
