"""What listeners and upstream clients share, built once by the server and
passed in (never global). Its own module so that the adapters' contracts
(gateway/protocols/base.py) can name it without importing the server."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from gateway.config.model import GatewayConfig
from gateway.config.server import ServerIdentity
from gateway.observability.accesslog import AccessLog
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.statistics import StatisticsStore
from gateway.observability.tracing import Tracing
from gateway.runtime.budget import InflightBudget
from gateway.runtime.offload import Offloader
from gateway.runtime.redis import RedisClients


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
    # Bytes in flight (limits.max_inflight_bytes) and the pool for body-sized work.
    budget: InflightBudget = field(default_factory=lambda: InflightBudget(1 << 62))
    offload: Offloader = field(default_factory=Offloader)
    # The Redis client filters share (the `redis:` section), made on first use.
    redis: RedisClients = field(default_factory=RedisClients)
