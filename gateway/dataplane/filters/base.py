"""The filter chain: what a route's requests pass on their way to the
upstream and back, written once for every protocol (Envoy's vocabulary).

Each listener's server decodes a request into the canonical
:class:`InferRequest`; the data plane resolves its route and, when the route
lists policies, runs them in order around the upstream call:

    on_request(call)            in order; may answer early (an InferResponse:
                                a cache hit) or refuse (raise GatewayError: a
                                limit exceeded); later filters and the upstream
                                are then skipped
    upstream call               mirrors, batching, attempts and retries
    on_response(call, answer)   in reverse order, for the filters whose
                                on_request let the request on; may observe
                                or replace the answer
    on_error(call, error)       in reverse order, instead of on_response

A filter sees the canonical request (tensors, parameters), the context
(headers, ids, listener, client protocol), the resolved route, and
protocol-neutral outcomes; the frontend then answers in the client's protocol
(a GatewayError with ``retry_after`` becomes Retry-After / retry info). So one
filter serves every protocol and transport, unary and streamed.

A new filter is one module holding a :class:`Filter` subclass plus one line
in gateway/dataplane/filters/registry.py; a policy in the config names it by
its kind (gateway/config/policies.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from gateway.config.node import Node
from gateway.core.errors import GatewayError
from gateway.core.types import InferRequest, InferResponse, RequestContext
from gateway.dataplane.routing import Route
from gateway.runtime.services import GatewayServices

# What a FilterCall is for.
INFER = "infer"  # one request, one answer
STREAM = "stream"  # one request, answers as they come: on_response runs for each


class FilterCall:
    """One request as the chain's filters see it; ``notes`` is where a
    filter keeps what its on_response needs (a cache key, a start time),
    under its own policy name."""

    __slots__ = ("ctx", "kind", "notes", "request", "route")

    def __init__(self, request: InferRequest, ctx: RequestContext, route: Route, kind: str) -> None:
        self.request = request
        self.ctx = ctx
        self.route = route
        self.kind = kind
        self.notes: dict[str, Any] = {}


class Filter:
    """One policy's filter. Made once per configured policy and kept across
    reloads while its config stays the same (so its state, e.g. a rate
    limit's buckets, survives); :meth:`close` runs when it is dropped."""

    kind: ClassVar[str] = ""  # its key in a policy of the YAML: the registry's name for it

    def __init__(self, name: str, options: Any, services: GatewayServices) -> None:
        self.name = name  # the policy's name
        self.options = options
        self.services = services

    @classmethod
    def parse_options(cls, node: Node) -> Any:
        """The policy's options from its YAML value (errors go to ``node``);
        a filter without options accepts only an empty value."""
        if node.value not in (None, {}):
            node.error(f"'{cls.kind}' takes no options")
        return None

    @classmethod
    def options_schema(cls) -> dict[str, Any]:
        """The JSON Schema of the policy's options (`gateway schema`): what
        an editor can tell of them; parse_options stays the authority."""
        return {"type": ["object", "null"], "maxProperties": 0}

    async def on_request(self, call: FilterCall) -> InferResponse | None:
        """Before the upstream: None to go on, an answer to answer early, or
        raise a GatewayError to refuse."""
        return None

    async def on_response(self, call: FilterCall, response: InferResponse) -> InferResponse:
        """After the upstream (or a later filter's early answer)."""
        return response

    def on_error(self, call: FilterCall, error: GatewayError) -> None:
        """The request failed after this filter's on_request ran."""

    async def close(self) -> None:
        """The filter is no longer used (reload, shutdown)."""


class FilterChain:
    """A route's filters in the order its policies list them."""

    __slots__ = ("filters",)

    def __init__(self, filters: tuple[Filter, ...]) -> None:
        self.filters = filters

    async def run(self, call: FilterCall, send: Callable[[], Awaitable[InferResponse]]) -> InferResponse:
        """``send()`` (the upstream call) wrapped in the chain."""
        ran, response = await self.before(call)
        try:
            if response is None:
                response = await send()
            return await self.after(ran, call, response)
        except GatewayError as error:
            self.failed(ran, call, error)
            raise

    async def before(self, call: FilterCall) -> tuple[list[Filter], InferResponse | None]:
        """The request half: the filters whose on_request let the request
        on (they see its outcome), and an early answer if one gave it (the
        filter that answered or refused does not see it again)."""
        ran: list[Filter] = []
        try:
            for step in self.filters:
                early = await step.on_request(call)
                if early is not None:
                    return ran, early
                ran.append(step)
        except GatewayError as error:
            self.failed(ran, call, error)
            raise
        return ran, None

    @staticmethod
    async def after(ran: list[Filter], call: FilterCall, response: InferResponse) -> InferResponse:
        """The response half, for one answer (each of a stream's)."""
        for step in reversed(ran):
            response = await step.on_response(call, response)
        return response

    @staticmethod
    def failed(ran: list[Filter], call: FilterCall, error: GatewayError) -> None:
        for step in reversed(ran):
            step.on_error(call, error)
