"""The response cache's ``redis`` backend: answers kept in the `redis:`
server, so every gateway process and replica running the policy shares them.

An entry is ``gateway:response_cache:<policy>:<key digest, hex>`` holding
the answer in the binary form of cache_entry.py, set with the policy's ttl
as its expiry (``SET ... PX``). A look-up is one ``GETRANGE`` of at most
``max_bytes`` (so no value, whatever wrote it, makes the worker read more);
a store one ``SET``, made only for an answer whose entry fits ``max_bytes``.
Redis's own ``maxmemory`` bounds what all entries take together.

Nothing is kept in the worker: a value read is charged to the memory
budget from its arrival until its answer is handed to the request (then,
like an upstream's answer, it is the request's); an entry being stored
from before it is built until Redis has it. Big entries are read and built
in the offload pool.

Redis slow or down (no answer within ``redis.timeout``, an error reply) is
a miss, and an answer not stored: never an error to the client. A value
that is no valid entry for its key (cut, changed, foreign) is a miss too.
Both are counted in ``gateway_cache_redis_errors_total{policy,error}`` and
logged, at most one line per policy every 10 s.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from gateway.core.errors import GatewayError
from gateway.core.types import InferResponse
from gateway.dataplane.filters.cache_entry import InvalidEntry, entry_parts, entry_size, read_entry
from gateway.dataplane.filters.cache_key import rough_size
from gateway.dataplane.filters.cache_store import CachedAnswer, CacheUnavailable
from gateway.runtime.budget import InflightBudget
from gateway.runtime.offload import Offloader
from gateway.runtime.redis import RedisClient, RedisReplyError, RedisUnavailable, encode_command

log = logging.getLogger(__name__)

REDIS_KEY_PREFIX = "gateway:response_cache:"
DEFAULT_MAX_BYTES = 1 << 20
# An entry is read and written whole by the worker's one Redis connection
# (its copies on the loop, and every other call waits behind it): entries
# stay small. Within the client's largest reply (MAX_BULK_BYTES).
MAX_ENTRY_BYTES = 16 << 20
LOG_EVERY_SECONDS = 10.0


class Counter(Protocol):
    """A counter's child (prometheus-client's, or any with ``inc``)."""

    def inc(self, amount: float = 1) -> None: ...


class RedisBackend:
    """Answers kept in Redis under the policy's prefix, each ``ttl``."""

    def __init__(self, policy: str, ttl: float, max_bytes: int, client: RedisClient, budget: InflightBudget,
                 offload: Offloader, errors: tuple[Counter, Counter]) -> None:
        self.policy = policy
        self.max_bytes = max_bytes
        self._prefix = f"{REDIS_KEY_PREFIX}{policy}:".encode()
        self._expiry_ms = max(1, round(ttl * 1000))
        self._client = client
        self._budget = budget
        self._offload = offload
        self._unavailable, self._invalid = errors
        self._unlogged = 0  # errors since the last log line about them
        self._logged_at = -LOG_EVERY_SECONDS

    def redis_key(self, key: bytes) -> bytes:
        return self._prefix + key.hex().encode()

    async def get(self, key: bytes) -> CachedAnswer | None:
        try:
            value = await self._client.call(b"GETRANGE", self.redis_key(key), 0, self.max_bytes - 1)
        except RedisReplyError as error:  # WRONGTYPE: the key holds no string
            self._failed(self._invalid, "read a value that is no entry", error)
            return None
        except RedisUnavailable as error:
            self._failed(self._unavailable, "could not look up an answer in Redis", error)
            raise CacheUnavailable from None
        if not value:  # GETRANGE of no key
            return None
        held = self._budget.reserve()
        try:
            held.grow(len(value))
            model_version, tensors, parameters = await self._offload.run(len(value), read_entry, value, key,
                                                                         held.grow)
        except InvalidEntry as error:
            self._failed(self._invalid, "read a value that is no entry", error)
            return None
        except GatewayError:  # the memory budget has no room for it now: a miss
            return None
        finally:
            held.release()
        return 0.0, len(value), model_version, tensors, parameters

    async def put(self, key: bytes, response: InferResponse) -> bool:
        held = self._budget.reserve()
        try:
            size = await self._offload.run(rough_size(response.outputs), entry_size, response)
            if size > self.max_bytes:
                return False
            held.grow(2 * size)  # the entry, then the command framing it
            command = await self._offload.run(size, self._command, key, response)
            await self._client.call_encoded(command)
        except GatewayError:  # the memory budget has no room for it now: answered, not kept
            return False
        except (ValueError, TypeError):  # what the entry cannot carry (JSON, BYTES that are no bytes): not kept
            return False
        except RedisUnavailable as error:  # an error reply too: OOM under maxmemory with noeviction
            self._failed(self._unavailable, "could not store an answer in Redis", error)
            return False
        finally:
            held.release()
        return True

    def _command(self, key: bytes, response: InferResponse) -> bytes:
        value = b"".join(entry_parts(key, response))
        return encode_command((b"SET", self.redis_key(key), value, b"PX", self._expiry_ms))

    def _failed(self, counter: Counter, what: str, error: Exception) -> None:
        counter.inc()
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_SECONDS:
            log.warning("response cache %r: %s (%s); %d look-up(s) or store(s) went without Redis since the "
                        "last report", self.policy, what, error, self._unlogged)
            self._logged_at, self._unlogged = now, 0

    async def close(self) -> None:
        """Nothing to give back: the client is the worker's, the entries Redis's."""
