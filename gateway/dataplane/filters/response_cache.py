"""The response cache filter (Triton's response cache semantics, for every
protocol): a request asked before on the route is answered from the cache
without calling the upstream, in the client's own protocol.

``response_cache: {ttl: 60s, max_bytes: 256MiB, backend: memory}``

The key (cache_key.py) covers the route, the model name and version the
client asked for, the parameters, every input (name, datatype, shape,
bytes) and the requested outputs, so the same tensors asked over V2 REST
(JSON or binary), V2 gRPC or any other protocol are one question. What is
kept and how (cache_store.py): the answer's tensors, never an upstream's
bytes; a hit is the asking request's own answer (its id, its model name).
``backend: memory`` keeps them in the worker (cache_store.py), ``backend:
redis`` in the `redis:` server, shared by every gateway (cache_redis.py).

Never looked up (counted as ``skip``): streamed requests (ModelStreamInfer,
so decoupled models too: they answer only through streams), the steps of a
sequence (``sequence_id``: their answer depends on state), routes with
mirrors (a hit would send the shadows nothing), and requests carrying no
tensors (a body relayed as it is, which the gateway does not read).

A miss goes upstream translated rather than relayed as the client's bytes,
so that its answer comes back as tensors to keep. Each counts in
``gateway_cache_requests_total{result}`` and in the model's statistics
(cache_hit / cache_miss, with the look-up's and the store's time).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gateway.config.node import Node
from gateway.core.errors import GatewayError
from gateway.core.record import CACHE_HIT, CACHE_MISS
from gateway.core.types import InferResponse
from gateway.dataplane.affinity import sequence_step
from gateway.dataplane.filters.base import STREAM, Filter, FilterCall
from gateway.dataplane.filters.cache_key import request_key, route_salt
from gateway.dataplane.filters.cache_redis import DEFAULT_MAX_BYTES as REDIS_DEFAULT_MAX_BYTES
from gateway.dataplane.filters.cache_redis import MAX_ENTRY_BYTES as REDIS_MAX_ENTRY_BYTES
from gateway.dataplane.filters.cache_redis import RedisBackend
from gateway.dataplane.filters.cache_store import CacheBackend, CacheUnavailable, MemoryBackend, answer_to
from gateway.dataplane.routing import Route
from gateway.runtime.services import GatewayServices

DEFAULT_TTL = 60.0
DEFAULT_MAX_BYTES = 256 << 20
BACKENDS = ("memory", "redis")
SKIP = "skip"  # gateway_cache_requests_total's third result, beside CACHE_HIT and CACHE_MISS


@dataclass(frozen=True, slots=True)
class ResponseCacheOptions:
    ttl: float = DEFAULT_TTL  # seconds an answer is served after it was stored
    # memory: bytes kept in all (per worker), also charged to the memory budget; redis: one entry's bytes
    max_bytes: int = DEFAULT_MAX_BYTES
    backend: str = "memory"

    @property
    def uses_redis(self) -> bool:
        return self.backend == "redis"


class ResponseCache(Filter):
    kind = "response_cache"

    def __init__(self, name: str, options: ResponseCacheOptions, services: GatewayServices) -> None:
        super().__init__(name, options, services)
        self.store: CacheBackend
        redis = services.config.redis  # present when options.uses_redis: the config parser checks it
        if options.uses_redis and redis is not None:
            self.store = RedisBackend(name, options.ttl, options.max_bytes, services.redis.client(redis),
                                      services.budget, services.offload, services.metrics.cache_redis_counters(name))
        else:
            self.store = MemoryBackend(options.ttl, options.max_bytes, services.budget, services.offload)
        self._offload = services.offload
        metrics = services.metrics
        self._hits, self._misses, self._skips = (metrics.cache_result(r) for r in (CACHE_HIT, CACHE_MISS, SKIP))
        # Route name -> (the route's config, its salt): made once per route and configuration.
        self._salts: dict[str, tuple[Any, bytes]] = {}

    @classmethod
    def parse_options(cls, node: Node) -> ResponseCacheOptions:
        if node.value is None:
            return ResponseCacheOptions()
        if not node.is_mapping:
            node.error("must be a mapping: {ttl: 60s, max_bytes: 256MiB, backend: memory}")
            return ResponseCacheOptions()
        backend = node.choice("backend", BACKENDS, "memory")
        redis = backend == "redis"
        options = ResponseCacheOptions(node.duration("ttl", DEFAULT_TTL),
                                       node.size("max_bytes", REDIS_DEFAULT_MAX_BYTES if redis else DEFAULT_MAX_BYTES),
                                       backend)
        node.check_no_unknown_keys()
        if isinstance(options.ttl, float) and options.ttl <= 0:
            node.error("must be more than 0", "ttl")
        if isinstance(options.max_bytes, int) and options.max_bytes <= 0:
            node.error("must be more than 0", "max_bytes")
        elif redis and isinstance(options.max_bytes, int) and options.max_bytes > REDIS_MAX_ENTRY_BYTES:
            node.error(f"must be at most {REDIS_MAX_ENTRY_BYTES >> 20}MiB with backend: redis (one entry's bytes)",
                       "max_bytes")
        return options

    @classmethod
    def options_schema(cls) -> dict[str, Any]:
        return {"type": ["object", "null"], "additionalProperties": False, "properties": {
            "ttl": {"$ref": "#/$defs/Duration", "default": "60s",
                    "description": "how long an answer is served after it was stored"},
            "max_bytes": {"$ref": "#/$defs/Size",
                          "description": "memory: bytes of answers kept per worker, also charged to the memory "
                                         "budget (default 256MiB); redis: the largest entry stored (default "
                                         f"1MiB, at most {REDIS_MAX_ENTRY_BYTES >> 20}MiB)"},
            "backend": {"enum": list(BACKENDS), "default": "memory",
                        "description": "where answers are kept: memory (this worker's) or redis (the redis: "
                                       "section's server, shared by every gateway using it)"}}}

    def _salt(self, route: Route) -> bytes:
        known = self._salts.get(route.name)
        if known is not None and known[0] is route.config:
            return known[1]
        rewrite = route.config.rewrite
        salt = route_salt(route.name, rewrite.model, rewrite.version, route.upstreams)
        self._salts[route.name] = (route.config, salt)
        return salt

    async def on_request(self, call: FilterCall) -> InferResponse | None:
        request = call.request
        if (call.kind == STREAM or call.route.config.mirror or (not request.inputs and request.raw is not None)
                or (request.parameters and sequence_step(request.parameters) is not None)):
            self._skips.inc()
            return None
        started = time.perf_counter()
        key = await request_key(request, self._salt(call.route), self._offload)
        record = call.ctx.record
        try:
            kept = await self.store.get(key)
        except CacheUnavailable:  # a miss, its answer not stored: the backend failed a moment ago
            self._misses.inc()
            record.cache, record.cache_seconds = CACHE_MISS, time.perf_counter() - started
            return None
        if kept is not None:
            self._hits.inc()
            answer = answer_to(kept, request)
            record.cache, record.cache_seconds = CACHE_HIT, time.perf_counter() - started
            return answer
        self._misses.inc()
        record.cache, record.cache_seconds = CACHE_MISS, time.perf_counter() - started
        call.notes[self.name] = key
        # Translated, not relayed: the answer must come back as tensors to keep.
        request.raw = None
        return None

    async def on_response(self, call: FilterCall, response: InferResponse) -> InferResponse:
        key = call.notes.get(self.name)
        if key is None or (response.raw is not None and not response.outputs):
            return response  # not looked up, or an answer relayed as bytes: no tensors to keep
        started = time.perf_counter()
        try:
            await self.store.put(key, response)
        except GatewayError:  # a kept answer is a saving, never a reason to fail the request
            pass
        call.ctx.record.cache_seconds += time.perf_counter() - started
        return response

    async def close(self) -> None:
        await self.store.close()
