"""The extensions as one service the V2 listeners share: REST and gRPC only
encode what this answers, so the two cannot drift apart."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from typing import Any

from gateway.config.extensions import CLASSIFICATION, GATEWAY_EXTENSIONS, SYSTEM_SHARED_MEMORY
from gateway.core.cache import TtlCache
from gateway.core.errors import ErrorKind, GatewayError, unsupported
from gateway.core.types import MODEL_CONFIG_OPERATION, InferRequest, InferResponse, RequestContext, Tensor
from gateway.observability.statistics import ModelStatistics
from gateway.protocols.base import DataPlaneApi
from gateway.protocols.triton import classification as classes
from gateway.protocols.triton import shm, turned_off
from gateway.protocols.triton.context import side_context
from gateway.protocols.triton.labels import LabelCache
from gateway.protocols.triton.modelconfig import max_batch_size, synthesize
from gateway.protocols.triton.repository import IndexEntry, repository_index
from gateway.runtime.services import GatewayServices

log = logging.getLogger(__name__)
# How long a model's configuration is reused to decide how classification
# treats its batch dimension.
CONFIG_TTL = 60.0
# Asking an upstream for a configuration it does not keep ends in one of these.
_NO_CONFIG = (ErrorKind.UNSUPPORTED, ErrorKind.MODEL_NOT_FOUND)


class Extensions:
    """Extensions of one listener: those it can offer (``offered``; both V2
    listeners offer all) that the configuration turns on (``server.extensions``)
    are ``served``."""

    def __init__(self, dataplane: DataPlaneApi, services: GatewayServices,
                 offered: Sequence[str] = GATEWAY_EXTENSIONS) -> None:
        self.dataplane = dataplane
        self.services = services
        enabled = services.identity.extensions
        self.served: tuple[str, ...] = tuple(name for name in offered if name in enabled)
        self._configs: TtlCache[dict[str, Any]] = TtlCache(CONFIG_TTL)
        self._labels = LabelCache()

    def require(self, extension: str) -> None:
        if extension not in self.served:
            raise unsupported(turned_off(extension))

    def refusal(self, extension: str) -> str | None:
        """None when ``extension`` is served, else why not."""
        return None if extension in self.served else turned_off(extension)

    # --- system shared memory (shm.py) -----------------------------------------

    def shm_owner(self, ctx: RequestContext) -> str:
        """The listener and the credential the request came with: whose
        regions it sees (tenants separated by listener or token)."""
        listener = next((item for item in self.services.config.listeners if item.name == ctx.listener), None)
        auth = listener.auth if listener is not None else None
        credential = ""
        if auth is not None:
            credential = (ctx.headers.get(auth.header) or "").strip()
            if auth.scheme:  # "Bearer <token>": the token only, as the authenticator reads it
                credential = credential.partition(" ")[2].strip()
        return shm.owner(ctx.listener, credential)

    async def shm_status(self, name: str | None, ctx: RequestContext) -> list[shm.Region]:
        self.require(SYSTEM_SHARED_MEMORY)
        store = shm.registry()
        return await store.run(store.status, self.shm_owner(ctx), name)

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int, ctx: RequestContext) -> None:
        self.require(SYSTEM_SHARED_MEMORY)
        store = shm.registry()
        limit = self.services.config.server.max_shared_memory_regions
        await store.run(store.register, self.shm_owner(ctx), name, key, offset, byte_size, limit)

    async def shm_unregister(self, name: str | None, ctx: RequestContext) -> None:
        self.require(SYSTEM_SHARED_MEMORY)
        store = shm.registry()
        await store.run(store.unregister, self.shm_owner(ctx), name)

    async def shm_plan(self, request: InferRequest, ctx: RequestContext) -> shm.Plan:
        """The regions ``request`` names, checked. Asked only for a request
        that names one (``shm.named``): every other one costs no await."""
        self.require(SYSTEM_SHARED_MEMORY)
        return await shm.registry().run(shm.plan, request, self.shm_owner(ctx))

    # --- inference with classification --------------------------------------

    def infer(self, request: InferRequest, ctx: RequestContext) -> Awaitable[InferResponse]:
        """``dataplane.infer``, plus classification outputs when asked for
        (when classification is turned off, the parameter goes upstream).
        Only a request naming outputs can ask: the others go straight on."""
        if not request.outputs or CLASSIFICATION not in self.served:
            return self.dataplane.infer(request, ctx)
        return self._classified(request, ctx)

    async def _classified(self, request: InferRequest, ctx: RequestContext) -> InferResponse:
        wanted = classes.requested(request)
        if not wanted:
            return await self.dataplane.infer(request, ctx)
        response = await self.dataplane.infer(classes.without_parameter(request), ctx)
        batched = await self._batches(request.model_name, request.model_version, ctx, response.outputs)
        labels = self.dataplane.config.classification
        outputs = []
        for tensor in response.outputs:
            count = wanted.get(tensor.name)
            if count is None:
                outputs.append(tensor)
                continue
            label_file = labels.label_file(request.model_name, tensor.name)
            names = self._labels.get(label_file) if label_file else ()
            outputs.append(classes.classify(tensor, count, batched, names))
        response.outputs = outputs
        return response

    async def _batches(self, model: str, version: str, ctx: RequestContext, outputs: list[Tensor]) -> bool:
        """Whether the model's first dimension is a batch, from its config;
        when that cannot be had, whether every output has two or more dims."""
        try:
            config = await self._configs.get((ctx.listener, model, version),
                                             lambda: self.model_config(model, version, side_context(ctx)))
        except GatewayError as error:
            log.info("no configuration for model %r (%s); classifying by output shape", model, error.message)
            return all(len(t.shape) >= 2 for t in outputs)
        return max_batch_size(config) > 0

    # --- model configuration ----------------------------------------------------

    async def model_config(self, model: str, version: str, ctx: RequestContext) -> dict[str, Any]:
        """The upstream's configuration if it keeps one, else one written
        from the model metadata (marked ``synthesized``)."""
        try:
            config = await self.dataplane.call_operation(MODEL_CONFIG_OPERATION, InferRequest(model, version), ctx)
        except GatewayError as error:
            if error.kind not in _NO_CONFIG:
                raise
        else:
            if not isinstance(config, dict):
                raise GatewayError(ErrorKind.INTERNAL, f"model configuration of '{model}' is not an object")
            return {**config, "name": model}
        metadata = await self.dataplane.model_metadata(model, version, ctx)
        return synthesize(model, metadata, self.dataplane.config.classification)

    # --- statistics ----------------------------------------------------------

    async def statistics(self, model: str, version: str, ctx: RequestContext) -> list[ModelStatistics]:
        """The gateway's statistics of ``model`` (all when empty), as the
        asking listener sees them: only models it routes (the test ``/ready``
        applies), with the counts of the route it resolves them to. A model
        no request has used yet gets zeros if its route and upstream know it."""
        routes, listener, protocol, headers = self.dataplane.routes, ctx.listener, ctx.protocol, ctx.headers

        def visible(name: str, ver: str, route: str) -> bool:
            found = routes.resolve(name, ver, listener, protocol, headers)
            return found is not None and found.name == route

        if not model:
            found = self.services.statistics.snapshot(visible=visible)
            seen = {s.name for s in found}
            found += [ModelStatistics(name, "") for name in routes.explicit_models(listener)
                      if name not in seen and routes.resolve(name, "", listener, protocol, headers) is not None]
            return sorted(found, key=lambda s: (s.name, s.version))
        self.dataplane.resolve(model, version, side_context(ctx))  # unknown here: MODEL_NOT_FOUND, as /ready
        found = self.services.statistics.snapshot(model, version, visible)
        if not found:
            try:
                await self.dataplane.model_ready(model, version, side_context(ctx))
            except GatewayError as error:
                if error.kind is ErrorKind.MODEL_NOT_FOUND:
                    raise
            found = [ModelStatistics(model, version)]
        return found

    # --- repository ------------------------------------------------------------

    async def repository_index(self, ctx: RequestContext, ready_only: bool) -> list[IndexEntry]:
        return await repository_index(self.dataplane, ctx, ready_only)
