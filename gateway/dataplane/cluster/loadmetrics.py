"""Each endpoint's own load, read from its Prometheus text endpoint, for
the load_aware picker (balancing.py).

One task per cluster scrapes every endpoint each ``interval``, all at
once, off the request path: a request only reads the last load an
endpoint reported (``Endpoint.load``). A scrape is one HTTP/1.0 GET over
an asyncio stream (the data plane has no HTTP client of its own: the
transport layer's serves the protocols), bounded in time (``timeout``) and
size (MAX_SCRAPE_BYTES). One that fails or is slow keeps the last load
until it is ``stale_after`` old; then the load is unknown and the picker
falls back to least_request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gateway.config.upstreams import LoadMetrics
from gateway.core.promtext import gauge_sum
from gateway.dataplane.cluster.endpoint import Endpoint
from gateway.observability.counters import Counters, Event

log = logging.getLogger(__name__)

# An exposition larger than this is refused (Triton's with hundreds of models is ~1 MiB).
MAX_SCRAPE_BYTES = 4 << 20
# Failures of one endpoint's scrapes are logged at most this often.
LOG_EVERY_SECONDS = 30.0


class ScrapeFailed(Exception):
    """A scrape that got no load: its words say why."""


def metrics_location(endpoint: Endpoint, config: LoadMetrics) -> tuple[str, int]:
    """(host, port) of ``endpoint``'s metrics: its host, the configured port
    or else its own."""
    host, _, port = endpoint.address.rpartition(":")
    return host.strip("[]"), config.port if config.port is not None else int(port)


async def fetch_load(host: str, port: int, config: LoadMetrics) -> float:
    """One scrape: the gauge's sum in the exposition at ``host:port``."""
    reader, writer = await asyncio.open_connection(host, port, limit=64 << 10)
    try:
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        writer.write(f"GET {config.path} HTTP/1.0\r\nHost: {authority}\r\nAccept: text/plain\r\n"
                     "Connection: close\r\n\r\n".encode("ascii"))
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)
        if len(status) < 2 or status[1] != b"200":
            raise ScrapeFailed(f"answered {status[1].decode('ascii', 'replace')[:3] if len(status) > 1 else '?'}")
        chunks, size = [], 0
        while chunk := await reader.read(MAX_SCRAPE_BYTES + 1 - size):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_SCRAPE_BYTES:
                raise ScrapeFailed(f"the exposition is larger than {MAX_SCRAPE_BYTES} bytes")
        body = b"".join(chunks)
    finally:
        writer.close()
    name, labels = config.selector
    load = gauge_sum(body, name, labels)
    if load is None:
        raise ScrapeFailed(f"no series of {name} in the exposition")
    return load


class LoadScraper:
    """Scrapes the load of a cluster's endpoints every ``interval``."""

    def __init__(self, upstream: str, config: LoadMetrics, endpoints: Callable[[], list[Endpoint]],
                 counters: Counters, clock: Callable[[], float] = time.monotonic) -> None:
        self.upstream = upstream
        self.config = config
        self._endpoints = endpoints
        self._counters = counters
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._logged: dict[str, float] = {}  # endpoint -> when its last failure was logged

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"load metrics {self.upstream}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        while True:
            started = self._clock()
            await self.scrape_all()
            await asyncio.sleep(max(0.0, self.config.interval - (self._clock() - started)))

    async def scrape_all(self) -> None:
        """Scrape every endpoint once, together; then forget loads gone stale."""
        endpoints = list(self._endpoints())
        await asyncio.gather(*(self._scrape(e) for e in endpoints))
        now = self._clock()
        for endpoint in endpoints:
            if endpoint.load is not None and now - endpoint.loaded_at > self.config.stale_after:
                endpoint.load = None
                self._counters.emit(Event("endpoint_load", self.upstream, endpoint.address, "nan"))
        if len(self._logged) > len(endpoints):  # endpoints gone (DNS discovery)
            current = {e.address for e in endpoints}
            self._logged = {a: t for a, t in self._logged.items() if a in current}

    async def _scrape(self, endpoint: Endpoint) -> None:
        host, port = metrics_location(endpoint, self.config)
        try:
            async with asyncio.timeout(self.config.timeout):
                load = await fetch_load(host, port, self.config)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a refused, slow, broken or foreign answer: the load goes stale
            self._failed(endpoint, exc)
            return
        endpoint.load = load
        endpoint.loaded_at = self._clock()
        endpoint.in_flight_at_load = endpoint.in_flight  # this gateway's calls the load already counts
        self._counters.emit(Event("endpoint_load", self.upstream, endpoint.address, repr(load)))

    def _failed(self, endpoint: Endpoint, exc: Exception) -> None:
        now = self._clock()
        last = self._logged.get(endpoint.address)
        if last is None or now - last >= LOG_EVERY_SECONDS:
            self._logged[endpoint.address] = now
            words = "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
            log.warning("upstream %s endpoint %s: load metrics not read (%s); picking by least_request "
                        "while its load is unknown", self.upstream, endpoint.address, words)
