"""The rate_limit filter: a token bucket per key, local to the worker or
shared by every gateway process and replica through Redis.

    rate_limit: {requests_per_second: 20, burst: 40, key: "header:x-api-key", scope: local}

Both scopes run the same algorithm, GCRA (the generic cell rate algorithm):
a token bucket kept as one number per key, the "theoretical arrival time"
(TAT) at which the bucket is full again. A request at ``now`` is admitted
when ``max(TAT, now) + 1/rate - now <= burst/rate``, and then moves TAT on by
``1/rate``; so a full bucket admits ``burst`` requests at once and one more
every ``1/rate`` seconds. A refusal's Retry-After is the wait for the next
token, in whole seconds, at least 1.

- local: a dict of TATs in the worker, bounded by ``max_keys`` (least
  recently admitted keys go first; a key whose bucket is full again is
  the same as no entry, so dropping it changes nothing);
- global: one Lua script in Redis (EVALSHA: one round trip per request),
  timed by Redis's own clock, so every process shares one bucket per key.
  When Redis does not answer within ``redis.timeout``, ``redis.on_error``
  decides: allow the request, or refuse it (OVERLOADED, Retry-After 1).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.config.node import Node
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.types import InferResponse
from gateway.dataplane.filters.base import Filter, FilterCall
from gateway.runtime.budget import Reservation
from gateway.runtime.redis import RedisScript, RedisUnavailable
from gateway.runtime.services import GatewayServices

log = logging.getLogger(__name__)

SCOPES = ("local", "global")
KEY_SOURCES = ("client_ip", "model", "route", "listener")  # and header:<name>
DEFAULT_MAX_KEYS = 10_000
# Bounds that keep the bucket's arithmetic finite and exact enough in
# floating point: at most a million seconds between tokens, and bursts.
MIN_RATE, MAX_RATE = 1e-6, 1e9
MAX_BURST = 10**9
# A key longer than this (a long header value) is kept as its digest: each
# key's memory stays bounded, whatever the client sends.
MAX_KEY_CHARS = 128
KEY_SEPARATOR = "\x1f"
# What one local bucket may take (CPython, rounded up): its key's text (at
# most MAX_KEY_CHARS characters of up to 4 bytes each) and str header, the
# float, the dict slot.
BYTES_PER_KEY = 768
CHARGE_KEYS = 256  # local buckets are charged to the memory budget this many at a time
REDIS_KEY_PREFIX = "gateway:rate_limit:"
# At most one log line per policy this often about Redis errors (with a count).
LOG_EVERY_SECONDS = 10.0

# GCRA in one step: KEYS[1] holds the TAT (seconds, Redis's clock);
# ARGV = emission interval (1/rate), tolerance (burst/rate). Returns 0 when
# admitted, else the milliseconds until a token.
GCRA_SCRIPT = RedisScript("""
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local tat = tonumber(redis.call('GET', KEYS[1])) or now
local ahead = 0
if tat > now then ahead = tat - now end
local later = now + ahead + interval
local wait = ahead + interval - tolerance
if wait > 1e-9 then return math.max(1, math.ceil(wait * 1000)) end
redis.call('SET', KEYS[1], string.format('%.6f', later), 'PX', math.ceil((later - now) * 1000) + 1)
return 0
""")


@dataclass(frozen=True, slots=True)
class RateLimitOptions:
    requests_per_second: float
    burst: int
    key: tuple[str, ...] = ()  # what a bucket is per; () = one bucket for the policy
    scope: str = "local"
    max_keys: int = DEFAULT_MAX_KEYS  # local: buckets kept

    @property
    def uses_redis(self) -> bool:
        return self.scope == "global"


class RateLimited(GatewayError):
    """Past a policy's bucket: the protocol's overload form with Retry-After."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(ErrorKind.OVERLOADED, message)
        self.retry_after = retry_after


def _client_ip(peer: str) -> str:
    """The address without its port, from what the transports record: an
    IP (HTTP), grpc core's "ipv4:10.0.0.5:41234" / "ipv6:[::1]:41234"."""
    if peer.startswith(("ipv4:", "ipv6:")):
        host = peer[5:].rpartition(":")[0]
        return host.strip("[]")
    return peer


def _key_part(source: str) -> Callable[[FilterCall], str]:
    if source == "client_ip":
        return lambda call: _client_ip(call.ctx.record.peer)
    if source == "model":
        return lambda call: call.request.model_name
    if source == "route":
        return lambda call: call.ctx.route
    if source == "listener":
        return lambda call: call.ctx.listener
    header = source.partition(":")[2].lower()  # headers are kept with lower-case names
    return lambda call: call.ctx.headers.get(header, "")


def key_function(parts: tuple[str, ...]) -> Callable[[FilterCall], str]:
    """What names a request's bucket, from the options' ``key``."""
    if not parts:
        return lambda call: ""
    getters = [_key_part(part) for part in parts]
    if len(getters) == 1:
        return getters[0]
    return lambda call: KEY_SEPARATOR.join(get(call) for get in getters)


def _parse_key(node: Node) -> tuple[str, ...]:
    value = node.value
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    parts: list[str] = []
    for item in items:
        if not isinstance(item, str) or not (item in KEY_SOURCES or (item.startswith("header:") and item[7:])):
            node.error(f"must be {', '.join(KEY_SOURCES)} or header:<name>, or a list of them; got {item!r}")
        elif item in parts:
            node.error(f"names {item!r} twice")
        else:
            parts.append(item)
    return tuple(parts)


class RateLimitFilter(Filter):
    kind = "rate_limit"
    options: RateLimitOptions

    def __init__(self, name: str, options: RateLimitOptions, services: GatewayServices) -> None:
        super().__init__(name, options, services)
        self.interval = 1.0 / options.requests_per_second
        self.tolerance = options.burst * self.interval
        self.key_of = key_function(options.key)
        self.limited, self.redis_allowed, self.redis_denied = services.metrics.rate_limit_counters(name)
        self.tats: dict[str, float] = {}  # local: key -> when its bucket is full again (monotonic)
        self._held: list[Reservation] = []  # local: what the buckets may take, charged as they grow
        self._charged_keys = 0
        self.evicted = 0  # local: keys dropped while their bucket was not full
        redis = services.config.redis  # present when options.uses_redis: the config parser checks it
        self.redis = services.redis.client(redis) if options.uses_redis and redis is not None else None
        self._redis_errors = 0  # since the last log line about them
        self._logged_at = -LOG_EVERY_SECONDS
        self._global_args = (repr(self.interval), repr(self.tolerance))
        self.deny_without_redis = self.redis is not None and redis is not None and redis.on_error == "deny"

    @classmethod
    def parse_options(cls, node: Node) -> RateLimitOptions | None:
        if not node.is_mapping:
            node.error("must be a mapping: {requests_per_second: N, burst: N, key: ..., scope: local|global}")
            return None
        rate = node.get("requests_per_second", (int, float))
        if isinstance(rate, (int, float)) and not MIN_RATE <= rate <= MAX_RATE:
            node.error(f"must be from {MIN_RATE:g} to {MAX_RATE:g}, got {rate}", "requests_per_second")
            rate = None
        default_burst = max(1, math.ceil(rate)) if isinstance(rate, (int, float)) else 1
        burst = node.integer("burst", default_burst, minimum=1)
        if isinstance(burst, int) and burst > MAX_BURST:
            node.error(f"must be at most {MAX_BURST}, got {burst}", "burst")
        key = _parse_key(node.child("key", None))
        scope = node.choice("scope", SCOPES, "local")
        max_keys = node.integer("max_keys", DEFAULT_MAX_KEYS, minimum=1)
        node.check_no_unknown_keys()
        if not isinstance(rate, (int, float)) or not isinstance(burst, int) or not 1 <= burst <= MAX_BURST \
                or not isinstance(max_keys, int) or max_keys < 1:
            return None
        return RateLimitOptions(float(rate), burst, key, scope, max_keys)

    @classmethod
    def options_schema(cls) -> dict[str, Any]:
        key = {"type": "string", "pattern": "^(" + "|".join(KEY_SOURCES) + "|header:.+)$"}
        return {"type": "object", "required": ["requests_per_second"], "additionalProperties": False, "properties": {
            "requests_per_second": {"type": "number", "minimum": MIN_RATE, "maximum": MAX_RATE},
            "burst": {"type": "integer", "minimum": 1, "maximum": MAX_BURST,
                      "description": "the bucket's size; default: requests_per_second rounded up"},
            "key": {"anyOf": [key, {"type": "array", "items": key}],
                    "description": "client_ip | header:<name> | model | route | listener, or a list of them"},
            "scope": {"enum": list(SCOPES), "default": "local"},
            "max_keys": {"type": "integer", "minimum": 1, "default": DEFAULT_MAX_KEYS}}}

    async def on_request(self, call: FilterCall) -> InferResponse | None:
        if self.redis is None:
            self._local(call)
            return None
        return await self._global(call)

    def _bucket_key(self, call: FilterCall) -> str:
        key = self.key_of(call)
        if len(key) > MAX_KEY_CHARS:
            key = hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()
        return key

    def _refuse(self, wait: float) -> RateLimited:
        self.limited.inc()
        retry_after = max(1, math.ceil(wait))
        return RateLimited(f"rate limit of policy {self.name!r} exceeded; retry in {retry_after} s", retry_after)

    def _local(self, call: FilterCall) -> None:
        key = self._bucket_key(call)
        now = time.monotonic()
        tats = self.tats
        tat = tats.pop(key, None)  # popped and put back: the dict's order is least recently admitted first
        if tat is None:  # a new key: a full bucket, and room for it
            tat = now
            if len(tats) >= self.options.max_keys:
                self._evict(now)
            if len(tats) >= self._charged_keys:
                self._charge_keys()
        # How far the bucket is behind now, never (now + interval) - now: with
        # burst 1 that rounds to a hair over the tolerance and refuses a full bucket.
        ahead = tat - now if tat > now else 0.0
        wait = ahead + self.interval - self.tolerance
        if wait > 1e-9:
            tats[key] = tat
            raise self._refuse(wait)
        tats[key] = now + ahead + self.interval

    def _charge_keys(self) -> None:
        """Room for CHARGE_KEYS more keys, charged to the worker's memory
        budget (held until the filter closes: a dict does not shrink either);
        past the budget the request is refused at once (Saturated)."""
        more = min(CHARGE_KEYS, self.options.max_keys - self._charged_keys)
        held = self.services.budget.reserve()
        held.grow(more * BYTES_PER_KEY)
        self._held.append(held)
        self._charged_keys += more

    async def close(self) -> None:
        self.tats.clear()
        for held in self._held:
            held.release()
        self._held.clear()

    def _evict(self, now: float) -> None:
        """Room for new keys: the least recently admitted eighth goes (first
        of all, keys whose bucket is full again: dropping those changes nothing)."""
        tats = self.tats
        target = self.options.max_keys - max(1, self.options.max_keys // 8)
        full = [key for key, tat in tats.items() if tat <= now]
        for key in full:
            del tats[key]
        live = 0
        while len(tats) > target:
            del tats[next(iter(tats))]
            live += 1
        if live:
            self.evicted += live
            log.warning("rate limit policy %r: %d keys dropped before their bucket was full again "
                        "(max_keys %d reached); those keys start over with a full bucket",
                        self.name, live, self.options.max_keys)

    async def _global(self, call: FilterCall) -> InferResponse | None:
        assert self.redis is not None
        key = REDIS_KEY_PREFIX + self.name + ":" + self._bucket_key(call)
        try:
            wait_ms = await self.redis.evalsha(GCRA_SCRIPT, (key,), self._global_args)
        except RedisUnavailable as error:
            self._redis_failed(error)
            return None
        if wait_ms:
            raise self._refuse(int(wait_ms) / 1000)
        return None

    def _redis_failed(self, error: RedisUnavailable) -> None:
        deny = self.deny_without_redis
        (self.redis_denied if deny else self.redis_allowed).inc()
        self._redis_errors += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_SECONDS:
            log.warning("rate limit policy %r: Redis could not answer (%s); %s %d request(s) since the last "
                        "report (redis.on_error: %s)", self.name, error, "refused" if deny else "allowed",
                        self._redis_errors, "deny" if deny else "allow")
            self._logged_at, self._redis_errors = now, 0
        if deny:
            raise RateLimited(f"policy {self.name!r} cannot check its rate limit now; retry later", 1)
        return None
