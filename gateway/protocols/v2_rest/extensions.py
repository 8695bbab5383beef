"""Triton's extensions on the V2 REST listener: routes, and the JSON shapes
Triton's HTTP server answers with (what tritonclient.http parses).

Served: statistics (``GET /v2/models[/{m}[/versions/{v}]]/stats``), model
configuration (``GET .../config``), the repository index (``POST
/v2/repository/index``) and system shared memory (``/v2/systemsharedmemory``,
when turned on). CUDA shared memory: status (none) and unregister answer,
registering is refused. Refused with 501 and a reason: model load/unload,
CUDA shared memory, trace and log settings (see gateway.protocols.triton.REFUSALS).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from aiohttp import web

from gateway.config.extensions import MODEL_CONFIGURATION, MODEL_REPOSITORY, STATISTICS, SYSTEM_SHARED_MEMORY
from gateway.core.errors import malformed, unsupported
from gateway.core.types import RequestContext
from gateway.observability.statistics import Duration, ModelStatistics
from gateway.protocols.triton import REFUSALS, shm
from gateway.protocols.triton.repository import IndexEntry
from gateway.protocols.triton.service import Extensions
from gateway.protocols.v2_rest.codec import JSON_TYPE, load_json_object

AiohttpHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ExtensionsHost(Protocol):
    """What these routes need of the V2 REST frontend (which imports them)."""

    extensions: Extensions

    def context(self, request: web.Request) -> RequestContext: ...

    async def read_body(self, request: web.Request) -> bytes: ...


# --- JSON shapes ---------------------------------------------------------------


def _duration(d: Duration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def statistics_json(found: list[ModelStatistics]) -> dict[str, Any]:
    return {"model_stats": [{
        "name": s.name,
        "version": s.version,
        "last_inference": s.last_inference_ms,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {
            "success": _duration(s.success), "fail": _duration(s.fail), "queue": _duration(s.queue),
            "compute_input": _duration(s.compute_input), "compute_infer": _duration(s.compute_infer),
            "compute_output": _duration(s.compute_output),
            "cache_hit": _duration(s.cache_hit), "cache_miss": _duration(s.cache_miss),
        },
        "response_stats": {},
        "batch_stats": [{
            "batch_size": b.batch_size, "compute_input": _duration(b.compute_input),
            "compute_infer": _duration(b.compute_infer), "compute_output": _duration(b.compute_output),
        } for b in s.batches.values()],
        "memory_usage": [],
    } for s in found]}


def index_json(entries: list[IndexEntry]) -> list[dict[str, str]]:
    out = []
    for entry in entries:
        item = {"name": entry.name, "state": entry.state, "reason": entry.reason}
        if entry.version:
            item["version"] = entry.version
        out.append(item)
    return out


def parse_index_request(body: bytes) -> bool:
    """``ready`` of a repository-index request; the body may be empty
    (tritonclient.http sends none)."""
    if not body.strip():
        return False
    request = load_json_object(body, "the repository index request")
    ready = request.get("ready", False)
    if not isinstance(ready, bool):
        raise malformed("the repository index request: 'ready' must be a boolean")
    return ready


def _json(value: Any) -> web.Response:
    return web.Response(body=orjson.dumps(value), content_type=JSON_TYPE)


# --- routes -------------------------------------------------------------------


def add_routes(router: web.UrlDispatcher, frontend: ExtensionsHost) -> None:
    """Register before the model routes: ``GET /v2/models/stats`` must win
    over ``GET /v2/models/{model}``, as on Triton."""
    handlers = RestExtensionHandlers(frontend)
    router.add_get("/v2/models/stats", handlers.model_statistics)
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        router.add_get(prefix + "/stats", handlers.model_statistics)
        router.add_get(prefix + "/config", handlers.model_config)
    router.add_post("/v2/repository/index", handlers.repository_index)
    for prefix in ("/v2/systemsharedmemory", "/v2/systemsharedmemory/region/{region}"):
        router.add_get(prefix + "/status", handlers.system_shm_status)
        router.add_post(prefix + "/unregister", handlers.system_shm_unregister)
        router.add_get(prefix.replace("system", "cuda") + "/status", handlers.cuda_shm_status)
        router.add_post(prefix.replace("system", "cuda") + "/unregister", handlers.cuda_shm_unregister)
    router.add_post("/v2/systemsharedmemory/region/{region}/register", handlers.system_shm_register)
    refusals = {
        "/v2/repository/models/{model}/{action:load|unload}": "model_repository(load)",
        "/v2/cudasharedmemory/region/{region}/register": "cuda_shared_memory",
        "/v2/trace/setting": "trace",
        "/v2/models/{model}/trace/setting": "trace",
        "/v2/logging": "logging",
    }
    for path, extension in refusals.items():
        router.add_route("*", path, refusal(REFUSALS[extension]))
    for path in ("/v2/systemsharedmemory{tail:(/.*)?}", "/v2/cudasharedmemory{tail:(/.*)?}"):
        router.add_route("*", path, handlers.unknown_shm_request)


def refusal(reason: str) -> AiohttpHandler:
    async def unsupported_extension(request: web.Request) -> web.StreamResponse:
        raise unsupported(reason)

    return unsupported_extension


class RestExtensionHandlers:
    def __init__(self, frontend: ExtensionsHost) -> None:
        self.frontend = frontend
        self.extensions = frontend.extensions

    async def model_statistics(self, request: web.Request) -> web.Response:
        self.extensions.require(STATISTICS)
        model, version = request.match_info.get("model", ""), request.match_info.get("version", "")
        found = await self.extensions.statistics(model, version, self.frontend.context(request))
        return _json(statistics_json(found))

    async def model_config(self, request: web.Request) -> web.Response:
        self.extensions.require(MODEL_CONFIGURATION)
        model, version = request.match_info["model"], request.match_info.get("version", "")
        return _json(await self.extensions.model_config(model, version, self.frontend.context(request)))

    async def repository_index(self, request: web.Request) -> web.Response:
        self.extensions.require(MODEL_REPOSITORY)
        ready = parse_index_request(await self.frontend.read_body(request))
        return _json(index_json(await self.extensions.repository_index(self.frontend.context(request), ready)))

    # --- shared memory (gateway/protocols/triton/shm.py) -------------------------------

    async def system_shm_status(self, request: web.Request) -> web.Response:
        found = await self.extensions.shm_status(request.match_info.get("region"), self.frontend.context(request))
        return _json([region.status() for region in found])

    async def system_shm_register(self, request: web.Request) -> web.Response:
        self.extensions.require(SYSTEM_SHARED_MEMORY)
        fields = load_json_object(await self.frontend.read_body(request), "the shared memory register request")
        for required in ("key", "byte_size"):
            if required not in fields:
                raise malformed(f"Shared memory register request has no '{required}' field")
        key, offset, byte_size = shm.register_request(fields["key"], fields.get("offset", 0), fields["byte_size"])
        await self.extensions.shm_register(request.match_info["region"], key, offset, byte_size,
                                           self.frontend.context(request))
        return web.Response()

    async def system_shm_unregister(self, request: web.Request) -> web.Response:
        await self.extensions.shm_unregister(request.match_info.get("region"), self.frontend.context(request))
        return web.Response()

    async def cuda_shm_status(self, request: web.Request) -> web.Response:
        return _json(shm.cuda_status(request.match_info.get("region", "")))

    async def cuda_shm_unregister(self, request: web.Request) -> web.Response:
        return web.Response()  # none is ever registered

    async def unknown_shm_request(self, request: web.Request) -> web.Response:
        raise malformed(f"not a shared memory request: {request.method} {request.path[:200]}")
