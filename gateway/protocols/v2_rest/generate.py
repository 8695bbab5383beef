"""Triton's generate extension on the V2 REST listener (docs/protocols.md,
"generate / generate_stream"): ``POST .../generate`` and ``.../generate_stream``.

The request is one flat JSON object: a field named like one of the model's
inputs (its V2 metadata, cached) becomes that input, with the datatype the
model declares; every other field, and the members of a ``parameters``
object, become request parameters. The answer is one flat object:
``model_name``, ``model_version`` and each output as a field (a scalar
when it holds one element, else a flat list). ``generate`` answers one such
object; ``generate_stream`` sends one Server-Sent Event per upstream
response as it comes, and an error after the first event as an event
``{"error": ...}`` (before it, the usual V2 error answer).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from aiohttp import web

from gateway.core.cache import TtlCache
from gateway.core.contracts import StreamedResponse
from gateway.core.errors import ErrorKind, GatewayError, invalid, malformed
from gateway.core.limits import BYTES_ELEMENT_COST, TensorAllowance
from gateway.core.record import REQUEST_ID_HEADER
from gateway.core.tensors import written_as_integers
from gateway.core.types import (
    DECOUPLED_PARAMETER,
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestContext,
    TensorSpec,
)
from gateway.dataplane.routing import Route
from gateway.protocols.base import DataPlaneApi
from gateway.protocols.v2_rest import codec
from gateway.protocols.v2_rest.flat import (
    METADATA_TTL,
    PARAMETERS_FIELD,
    declares_datatype,
    tensor_fields,
    tensor_item,
)
from gateway.runtime.budget import Reservation, admit_json
from gateway.transport.cycle import StreamSlots
from gateway.transport.http_server.body import accepted_coding
from gateway.transport.http_server.exchange import HttpReply, HttpRequest, compress
from gateway.transport.http_server.sse import encode_event
from gateway.transport.http_server.streamed import StreamedAnswer

if TYPE_CHECKING:
    from gateway.config.limits import Limits
    from gateway.config.listeners import ListenerConfig
    from gateway.runtime.services import GatewayServices

log = logging.getLogger(__name__)

_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_NO_BINARY = memoryview(b"")


def exactly_one_response(model: str, got: str) -> GatewayError:
    """Triton's refusal of a generate call whose model did not answer once."""
    return invalid(f"generate expects model to produce exactly 1 response, model '{model}' produced {got}; "
                   "call generate_stream for a model that answers several")


# --- the request -------------------------------------------------------------


def _parameter(name: str, value: Any) -> Any:
    if isinstance(value, str | bool | int | float):
        return value
    kind = "null" if value is None else ("an object" if isinstance(value, dict) else "a list")
    raise invalid(f"parameter '{name[:100]}' has invalid type: {kind} (a string, number or boolean is expected; "
                  "the model has no input of this name)")


def _read_datatype(item: dict[str, Any], where: str, body: bytes | bytearray,
                   charge: Callable[[int], None] | None) -> str:
    """The datatype of a field whose model declares none, read from all its
    values: null is no number; integer literals are INT64 however large
    (beyond it: out of range), other numbers FP64."""
    leaves = item["data"]  # regular nested lists (tensor_item checked)
    while leaves and isinstance(leaves[0], list):
        leaves = [leaf for row in leaves for leaf in row]
    if any(leaf is None for leaf in leaves):
        raise invalid(f"{where}: null is not a number, string or boolean")
    if not leaves or not all(type(leaf) in (int, float) for leaf in leaves):
        return str(item["datatype"])  # strings or booleans by the first value; a mixture is refused as such
    return "INT64" if written_as_integers(leaves, body, charge) else "FP64"


def decode_generate_request(body: bytes | bytearray, model: str, version: str, specs: tuple[TensorSpec, ...],
                            limits: Limits, charge: Callable[[int], None] | None = None) -> InferRequest:
    """A generate request as an infer request of the model's inputs."""
    obj = codec.load_json_object(body, "the generate request")
    by_name = {spec.name: spec for spec in specs}
    if not by_name:
        raise invalid(f"model '{model}' declares no inputs in its metadata: generate maps request fields to "
                      "inputs by name")
    items: list[dict[str, Any]] = []
    parameters: dict[str, Any] = {}
    for name, value in obj.items():
        spec = by_name.get(name)
        if spec is not None:
            item = tensor_item(spec, value, f"input '{name}'")
            if not declares_datatype(spec):
                item["datatype"] = _read_datatype(item, f"input '{name}'", body, charge)
            items.append(item)
        elif name == PARAMETERS_FIELD:
            if not isinstance(value, dict):
                raise malformed(f"the generate request: '{PARAMETERS_FIELD}' must be an object")
            parameters.update((key, _parameter(key, item)) for key, item in value.items())
        else:
            parameters[name] = _parameter(name, value)
    if not items:
        names = ", ".join(f"'{spec.name}'" for spec in specs[:20])
        raise invalid(f"the generate request names none of the inputs of model '{model}' ({names})")
    inputs = codec.decode_tensors(items, _NO_BINARY, "input", limits.max_tensor_elements,
                                  TensorAllowance.of(limits, charge))
    return InferRequest(model, version, "", inputs, [], parameters)


# --- the answer ----------------------------------------------------------------


def _output_json(response: InferResponse) -> dict[str, Any]:
    answer: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    answer.update(tensor_fields(response.outputs, "output"))
    return answer


def encode_generate_response(response: InferResponse) -> bytes:
    return orjson.dumps(_output_json(response), option=_JSON_OPTIONS)


def encode_generate_event(response: InferResponse) -> bytes:
    return encode_event(encode_generate_response(response))


def answer_size(response: InferResponse) -> int:
    """An upper estimate of what encoding ``response`` builds (the memory
    budget; where it is encoded)."""
    return 256 + sum(t.data.size * BYTES_ELEMENT_COST if t.datatype == "BYTES" else 3 * t.data.nbytes
                     for t in response.outputs)


def _carries_outputs(part: StreamedResponse) -> bool:
    """Whether a streamed response is an answer, not just the end mark a
    decoupled model may send last (Triton's empty final response)."""
    return bool(part.response.outputs) or not part.final


# --- handlers ------------------------------------------------------------------


class GenerateHost(Protocol):
    """What the handlers need of the V2 REST frontend (which imports them)."""

    dataplane: DataPlaneApi
    services: GatewayServices
    listener: ListenerConfig

    def http_request(self, request: web.Request) -> HttpRequest: ...


class GenerateHandlers:
    def __init__(self, frontend: GenerateHost) -> None:
        self.frontend = frontend
        self.dataplane = frontend.dataplane
        self.services = frontend.services
        self._metadata: TtlCache[ModelMetadata] = TtlCache(METADATA_TTL)
        self._streams = StreamSlots(frontend.listener.name, codec.PROTOCOL, frontend.services)

    async def model_metadata(self, model: str, version: str, route: Route, ctx: RequestContext) -> ModelMetadata:
        """The model's V2 metadata (cached per route, model and version);
        empty when its upstream cannot say."""

        async def load() -> ModelMetadata:
            try:
                return await self.dataplane.model_metadata(model, version, ctx)
            except GatewayError as exc:
                if exc.kind is ErrorKind.UNSUPPORTED:
                    return ModelMetadata(model)
                raise

        return await self._metadata.get((route.index, model, version), load)

    async def _decode(self, request: HttpRequest) -> tuple[InferRequest, bool]:
        """The request as an infer request, and whether its model is decoupled."""
        model, version = request.params["model"], request.params.get("version", "")
        ctx = request.ctx
        # Routed before the body is read: an unknown model is 404 whatever the body holds.
        route = self.dataplane.resolve(model, version, ctx)
        body = await request.read()
        reservation = request.reservation()
        limits = self.services.config.limits
        offload = self.services.offload
        await admit_json(body, reservation, offload, limits, "the generate request")
        metadata = await self.model_metadata(model, version, route, ctx)
        started = time.perf_counter()
        infer_request = await offload.run(len(body), decode_generate_request, body, model, version, metadata.inputs,
                                          limits, reservation.grow)
        ctx.record.decode_seconds = time.perf_counter() - started
        return infer_request, bool(metadata.parameters.get(DECOUPLED_PARAMETER, False))

    async def _encoded(self, response: InferResponse, reservation: Reservation, ctx: RequestContext,
                       encode: Callable[[InferResponse], bytes]) -> bytes:
        size = answer_size(response)
        reservation.grow(size)  # what encoding builds, charged before it is built
        started = time.perf_counter()
        body: bytes = await self.services.offload.run(size, encode, response)
        ctx.record.encode_seconds += time.perf_counter() - started
        return body

    async def generate(self, request: HttpRequest) -> HttpReply:
        ctx = request.ctx
        infer_request, decoupled = await self._decode(request)
        if decoupled:
            response = await self._single_response(infer_request, ctx)
        else:
            response = await self.dataplane.infer(infer_request, ctx)
        infer_request.inputs = []  # let the request go before the answer is built
        body = await self._encoded(response, request.reservation(), ctx, encode_generate_response)
        reply = HttpReply(200, [body], codec.JSON_TYPE, {REQUEST_ID_HEADER: ctx.request_id})
        return await compress(reply, accepted_coding(request.headers.get("accept-encoding", "")),
                              self.services.offload)

    async def _single_response(self, request: InferRequest, ctx: RequestContext) -> InferResponse:
        """A decoupled model's one response (Triton's generate takes exactly
        one; a second ends the upstream call)."""
        answers: list[InferResponse] = []

        async def deliver(part: StreamedResponse) -> None:
            if not _carries_outputs(part):
                return
            if answers:
                raise exactly_one_response(request.model_name, "more")
            answers.append(part.response)

        await self.dataplane.infer_stream(request, ctx, deliver)
        if not answers:
            raise exactly_one_response(request.model_name, "none")
        return answers[0]

    async def generate_stream(self, raw: web.Request) -> web.StreamResponse:
        request = self.frontend.http_request(raw)
        self._streams.take()
        try:
            return await self._stream(raw, request, request.ctx)
        finally:
            self._streams.give_back()

    async def _stream(self, raw: web.Request, request: HttpRequest, ctx: RequestContext) -> web.StreamResponse:
        infer_request, _ = await self._decode(request)
        stream = StreamedAnswer(raw, ctx)
        budget = self.services.budget

        async def deliver(part: StreamedResponse) -> None:
            if not _carries_outputs(part):
                return
            held = budget.reserve()  # until the event is written
            try:
                await stream.send(await self._encoded(part.response, held, ctx, encode_generate_event))
            finally:
                held.release()

        ctx.end_marked = True  # events carry no final flag: the reply's end tells it
        try:
            await self.dataplane.infer_stream(infer_request, ctx, deliver)
        except Exception as exc:
            await stream.failed(exc, lambda error: encode_event(orjson.dumps({"error": error.message})))
        finally:
            stream.observe(self.services)
        return await stream.end()
