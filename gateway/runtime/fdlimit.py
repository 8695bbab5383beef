"""The open-file limit (RLIMIT_NOFILE) against what the configuration needs.

Every client connection, upstream connection and open file takes a file
descriptor. Many systems start processes with a soft limit of 1024, below
one listener's default ``max_connections``; the hard limit is usually far
higher. ``gateway serve`` raises the soft limit to the hard one at start
(each worker too) and warns when the configuration may need more;
``gateway check`` warns likewise. docs/security.md#connections.
"""

from __future__ import annotations

import logging
import resource
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config.model import GatewayConfig

log = logging.getLogger(__name__)

# Descriptors besides connections: the listening sockets, log files, the
# admin listener and its clients, gRPC's and the loop's own, DNS lookups.
# Shared-memory regions keep none (each copy opens its object and closes it).
MARGIN = 64
_NR_OPEN = "/proc/sys/fs/nr_open"  # Linux: the ceiling for an unlimited hard limit


def open_file_limit() -> tuple[int, int]:
    """(soft, hard); an unlimited hard limit as the kernel's ceiling."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = _ceiling()
    return soft, hard


def _ceiling() -> int:
    try:
        with open(_NR_OPEN) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def raise_open_file_limit() -> int:
    """Raise the soft limit to the hard one; the soft limit after."""
    soft, hard = open_file_limit()
    if soft == resource.RLIM_INFINITY or soft >= hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    except (OSError, ValueError) as exc:
        log.warning("cannot raise the open-file limit (RLIMIT_NOFILE) from %d to %d: %s", soft, hard, exc)
        return soft
    log.info("raised the open-file limit (RLIMIT_NOFILE) from %d to %d", soft, hard)
    return hard


def needed_open_files(config: GatewayConfig) -> int:
    """About the descriptors the configuration may hold at once: every
    listener's ``max_connections``, every upstream endpoint's connection
    pool, and :data:`MARGIN`."""
    listeners = len(config.listeners) * config.limits.max_connections
    upstreams = sum(len(u.endpoints) * u.connection_pool.max_connections for u in config.upstreams)
    return listeners + upstreams + MARGIN


def open_file_warning(config: GatewayConfig, limit: int) -> str | None:
    """A warning when the configuration may need more descriptors than ``limit``."""
    needed = needed_open_files(config)
    if needed <= limit:
        return None
    listeners = len(config.listeners)
    return (f"the configuration may hold about {needed} file descriptors ({listeners} listener"
            f"{'' if listeners == 1 else 's'} x limits.max_connections {config.limits.max_connections}, "
            f"upstream connection pools, {MARGIN} more), "
            f"over the open-file limit of {limit} (RLIMIT_NOFILE): past it new connections wait or idle ones "
            "are closed; raise the limit (ulimit -n, systemd LimitNOFILE, the container's nofile ulimit) or "
            "lower limits.max_connections")
