"""The `redis:` section: the one Redis server a worker's filters share
(a global rate limit's buckets; gateway/runtime/redis.py is its client)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.config.address import parse_address
from gateway.config.node import Node

ON_ERROR = ("allow", "deny")  # what a filter does when Redis cannot answer in time
DEFAULT_REDIS_TIMEOUT = 0.05


@dataclass(frozen=True, slots=True)
class RedisConfig:
    address: str  # host:port of the Redis server
    timeout: float = DEFAULT_REDIS_TIMEOUT  # the longest a request waits for Redis (connecting included)
    on_error: str = "allow"  # allow: the request goes on without Redis; deny: it is refused (OVERLOADED)

    def host_port(self) -> tuple[str, int]:
        host, _, port = self.address.rpartition(":")
        return host.strip("[]"), int(port)


def parse_redis(node: Node) -> RedisConfig | None:
    if node.value is None:
        return None
    if not node.is_mapping:
        node.error("must be a mapping: {address: HOST:PORT, timeout: 50ms, on_error: allow}")
        return None
    address = parse_address(node.child("address"))
    timeout = node.duration("timeout", DEFAULT_REDIS_TIMEOUT)
    if isinstance(timeout, float) and timeout <= 0:
        node.error("must be more than 0", "timeout")
    on_error = node.choice("on_error", ON_ERROR, "allow")
    node.check_no_unknown_keys()
    if address is None or address.port == 0:
        if address is not None:
            node.error("needs a port (1-65535)", "address")
        return None
    return RedisConfig(str(address), timeout, on_error)


def check_redis_users(node: Node, redis: RedisConfig | None, policies: tuple[Any, ...]) -> None:
    """A policy whose options say ``uses_redis`` needs the `redis:` section."""
    if redis is not None:
        return
    for policy in policies:
        if getattr(policy.options, "uses_redis", False):
            node.error(f"policy {policy.name!r} needs Redis: add a top-level redis: {{address: HOST:PORT}}")
