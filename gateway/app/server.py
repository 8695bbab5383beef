"""Start and stop the whole gateway: data plane, listeners, admin; reload and drain."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import ssl
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway import __version__
from gateway.app.admin import ADMIN_AUTH, ReloadResult, start_admin
from gateway.app.configure import load_config
from gateway.config.auth import CredentialConfig
from gateway.config.model import GatewayConfig
from gateway.config.node import ConfigError
from gateway.config.server import ServerIdentity
from gateway.dataplane.plane import DataPlane
from gateway.observability.accesslog import AccessLog
from gateway.observability.counters import Counters
from gateway.observability.looplag import LoopLagMonitor
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.statistics import StatisticsStore
from gateway.observability.tracing import Tracing
from gateway.protocols import registry
from gateway.protocols.base import DataPlaneApi, Frontend
from gateway.protocols.registry import backend as protocol_backend
from gateway.protocols.registry import framing_headers
from gateway.runtime.budget import InflightBudget
from gateway.runtime.services import GatewayServices
from gateway.runtime.tls import server_ssl_context

log = logging.getLogger(__name__)

# Sections a reload cannot change: they are bound sockets and their limits.
RESTART_SECTIONS = ("listeners", "admin", "limits", "server", "redis")


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


def restart_needed(running: GatewayConfig, new: GatewayConfig) -> list[str]:
    return [f"{section}: changed, which needs a restart (a reload applies upstreams, routes, drain, "
            "readiness and reload)" for section in RESTART_SECTIONS
            if getattr(running, section) != getattr(new, section)]


def listener_tls_problems(config: GatewayConfig) -> list[str]:
    """Listener certificates and keys of ``config`` that do not load. A
    reload with any is refused whole, so a broken rotation is reported and
    the running material keeps serving."""
    problems = []
    for index, listener in enumerate(config.listeners):
        if listener.tls is not None:
            try:
                server_ssl_context(listener.tls)
            except (OSError, ssl.SSLError) as exc:
                problems.append(f"listeners[{index}].tls: cannot load {listener.tls.cert} and "
                                f"{listener.tls.key}: {exc}")
    return problems


class Gateway:
    def __init__(self, config: GatewayConfig, config_path: str | Path | None = None,
                 registry: CollectorRegistry | None = None, *, counters: Counters | None = None,
                 worker: int | None = None, multiprocess_dir: str | None = None,
                 prepare: Callable[[GatewayConfig], GatewayConfig] | None = None) -> None:
        # Applied to every configuration read from the file (workers: their
        # supervisor's reserved ports), so a reload compares like with like.
        self._prepare = prepare or (lambda config: config)
        self.config = config
        self.config_path = config_path
        version = config.server.version or __version__
        metrics = build_metrics(config, version, registry, multiprocess_dir)
        self.services = GatewayServices(
            config, ServerIdentity(config.server.name, version, config.server.extensions),
            metrics=metrics,
            access_log=AccessLog.open(config.observability.access_log, worker,
                                      on_drop=metrics.record_access_log_dropped),
            reuse_port=worker is not None, worker=worker,
            tracing=Tracing(config.observability.tracing, version, worker)
            if config.observability.tracing.enabled else None,
            statistics=StatisticsStore(config.observability.metrics.max_model_labels),
            budget=InflightBudget(config.limits.max_inflight_bytes, metrics.budget_refusals.inc))
        self.counters = counters or Counters()
        # The data plane knows no protocol: the registry's backends and framing headers are handed in.
        self.dataplane = DataPlane(config, self.services, self.counters, backends=protocol_backend,
                                   framing_headers=framing_headers())
        self.frontends: dict[str, Frontend] = {}
        self._admin: web.AppRunner | None = None
        self.admin_port = 0
        self._stopped = asyncio.Event()
        self._reload_lock = asyncio.Lock()
        self._watcher: asyncio.Task[None] | None = None
        budget = self.services.budget
        self._loop_lag = LoopLagMonitor(metrics.observe_loop_lag,
                                        sample=lambda: metrics.inflight_bytes.set(budget.used))

    @property
    def ports(self) -> dict[str, int]:
        ports = {name: fe.bound_port for name, fe in self.frontends.items()}
        if self._admin is not None:
            ports["admin"] = self.admin_port
        return ports

    async def start(self) -> None:
        self._loop_lag.start()
        await self.dataplane.start()
        dataplane: DataPlaneApi = self.dataplane  # what a frontend may ask of it (checked by mypy)
        for listener in self.config.listeners:
            frontend_class = registry.load(listener.protocol, "frontend")
            frontend = frontend_class(listener, dataplane, self.services)
            await frontend.start()
            self.frontends[listener.name] = frontend
        if self.config.admin.address is not None:
            self._admin, self.admin_port = await start_admin(self, self.config.admin.address)
        self._start_watcher()

    def reload_security(self, config: GatewayConfig) -> None:
        """Re-read certificate and token files of running listeners and of
        the admin token, from ``config`` (the same listeners by name), e.g.
        after cert-manager rotated the files in place. Upstream clients read
        theirs when started, so a reload that rebuilds them needs nothing
        more. Every listener is tried; the first failure is raised after
        (OSError or ssl.SSLError), and a listener that failed keeps its old
        material."""
        by_name = {listener.name: listener for listener in config.listeners}
        failures: list[Exception] = []
        for name, frontend in self.frontends.items():
            try:
                if name in by_name:
                    frontend.reload_security(by_name[name])
            except (OSError, ssl.SSLError) as exc:
                log.error("listener %s: cannot reload certificates or tokens: %s", name, exc)
                failures.append(exc)
        if self._admin is not None and config.admin.token is not None and ADMIN_AUTH in self._admin.app:
            self._admin.app[ADMIN_AUTH].reload(CredentialConfig(config.admin.token))
        if failures:
            raise failures[0]

    async def stop(self, grace: float = 5.0) -> None:
        """Close listeners; in-flight requests get ``grace`` seconds to finish."""
        self.dataplane.draining = True
        if self._watcher is not None:
            self._watcher.cancel()
        await asyncio.gather(*(fe.stop(grace) for fe in self.frontends.values()))
        if self._admin is not None:
            await self._admin.cleanup()
            self._admin = None
        await self.dataplane.close()
        await self.services.redis.close()
        await self._loop_lag.stop()
        self.services.access_log.close()  # bounded: a stuck sink never holds up the exit
        self.services.offload.close()
        if self.services.tracing is not None:
            self.services.tracing.close()
        self._stopped.set()

    async def drain(self, delay: float | None = None) -> None:
        """Graceful shutdown: readiness turns false at once, new requests are
        still served for ``delay`` seconds (load balancers take a while to stop
        sending), then listeners close and in-flight requests get the drain
        timeout to finish."""
        settings = self.config.drain
        delay = settings.delay if delay is None else delay
        self.dataplane.draining = True
        log.info("draining: not ready; serving new requests for %gs more, then closing listeners", delay)
        await asyncio.sleep(delay)
        log.info("closing listeners; in-flight requests have %gs to finish", settings.timeout)
        await self.stop(settings.timeout)
        log.info("stopped")

    # --- reload ------------------------------------------------------------------

    async def reload(self) -> ReloadResult:
        """Re-read the configuration file and switch to it atomically. An
        invalid file is rejected with every problem logged by its YAML path,
        and the running configuration keeps serving."""
        async with self._reload_lock:
            source = str(self.config_path) if self.config_path is not None else "<embedded default>"
            if self.dataplane.draining:
                return self._reload_failed(source, ["<reload>: the gateway is shutting down"])
            try:
                # Reading YAML is pure Python, up to seconds for a file at the
                # bounds of gateway/config/reader.py: off the loop, as a body is.
                offload = self.services.offload
                config = self._prepare(await offload.run(offload.min_bytes, load_config, self.config_path))
                problems = restart_needed(self.config, config) or listener_tls_problems(config)
                if problems:
                    raise ConfigError(problems)
                services = dataclasses.replace(self.services, config=config)
                await self.dataplane.swap(config, services)
            except ConfigError as exc:
                return self._reload_failed(source, exc.problems)
            except Exception as exc:  # e.g. a client that cannot start
                log.exception("reload of %s failed", source)
                return self._reload_failed(source, [f"<reload>: {type(exc).__name__}: {exc}"])
            self.config, self.services = config, services
            try:  # certificates and tokens rotated in place (same paths)
                self.reload_security(config)
            except (OSError, ssl.SSLError):
                pass  # logged per listener; each keeps its old material
            for upstream in config.upstreams:
                services.metrics.declare_upstream(upstream.name, [str(e) for e in upstream.endpoints])
            self.counters.reload_succeeded()
            log.info("configuration reloaded from %s: %d upstreams, %d routes", source, len(config.upstreams),
                     len(config.routes))
            self._start_watcher()
            return ReloadResult(True, (), source)

    def _reload_failed(self, source: str, problems: list[str]) -> ReloadResult:
        for problem in problems:
            log.error("reload rejected, the running configuration keeps serving: %s: %s", source, problem)
        self.counters.reload_failed("; ".join(problems)[:1024])
        return ReloadResult(False, tuple(problems), source)

    def _start_watcher(self) -> None:
        if self._watcher is None and self.config.reload.watch_interval and self.config_path is not None:
            self._watcher = asyncio.create_task(self._watch(Path(self.config_path)), name="config watcher")

    async def _watch(self, path: Path) -> None:
        """Reload when the file changes: its size, modification time, or the
        file itself. A Kubernetes ConfigMap volume swaps a symlink to a new
        directory of files (`..data`), so the path then names another inode,
        whatever its size and time say."""
        def signature() -> tuple[int, int, int, int] | None:
            try:
                stat = os.stat(path)  # through the symlinks: the file they name now
            except OSError:
                return None
            return stat.st_mtime_ns, stat.st_size, stat.st_ino, stat.st_dev

        seen = signature()
        try:
            while (interval := self.config.reload.watch_interval) is not None:
                await asyncio.sleep(interval)
                current = signature()
                if current is not None and current != seen:
                    seen = current
                    log.info("%s changed; reloading", path)
                    await self.reload()
        finally:
            self._watcher = None

    # --- signals -------------------------------------------------------------------

    def reopen_logs(self) -> None:
        """SIGUSR1 (logrotate): the access log reopens its file by path."""
        log.info("SIGUSR1: reopening the access log")
        self.services.access_log.reopen()

    async def run_until_signalled(self) -> None:
        """SIGTERM: drain as configured; SIGINT: drain without the delay
        (someone at a terminal); SIGHUP: reload; SIGUSR1: reopen the access
        log file. Returns once stopped."""
        loop = asyncio.get_running_loop()
        stop_requested = asyncio.Event()
        delays: list[float | None] = []

        def on_stop(delay: float | None) -> None:
            delays.append(delay)
            stop_requested.set()

        loop.add_signal_handler(signal.SIGTERM, on_stop, None)
        loop.add_signal_handler(signal.SIGINT, on_stop, 0.0)
        reloads: set[asyncio.Task[ReloadResult]] = set()

        def on_reload() -> None:
            task = asyncio.ensure_future(self.reload())
            reloads.add(task)  # keep a reference until it is done
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, on_reload)
        loop.add_signal_handler(signal.SIGUSR1, self.reopen_logs)
        try:
            await stop_requested.wait()
            await self.drain(delays[0])
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
                loop.remove_signal_handler(sig)
