"""V2 REST upstream client, JSON or Triton's binary extension.

One keep-alive connection pool per endpoint (gateway/upstream_http.py). ``binary: auto`` asks the
server's metadata (``GET /v2``) whether it lists ``binary_tensor_data``;
when that cannot be read it tries binary and falls back to JSON once a
server rejects binary with 400/415/422 (MLServer 1.7.1 answers 422), and
remembers what worked.

Streams (``streaming: infer_stream``): a request of a stream goes to
MLServer's ``POST /v2/models/{m}/infer_stream``, whose reply is server-sent
events, one V2 JSON response each (gateway/http/sse.py reads them as they
come). ``streaming: unary`` (the default: plain V2 servers lack the
endpoint) answers a stream's request with one ``/infer`` call.
``streaming: generate_stream`` sends it to Triton's ``generate_stream`` as
the flat generate object and reads each event back by the model's metadata
(v2_rest/flat.py, shared with the listener's generate extension).

Pass-through (``passthrough: true``, the default): a request that came from
a V2 REST client carries its body (:class:`~gateway.types.RawPayload`);
those bytes go upstream unchanged (a binary body only to an endpoint that
takes binary; else the request is translated to JSON). The upstream's
answer comes back unchanged when it can honour what the client asked of
the outputs itself: always for an endpoint that takes binary tensors
(Triton's extensions, output selection included), otherwise only when the
client asked for neither a selection of outputs nor binary outputs.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson

from gateway.config.address import Address
from gateway.config.node import Node
from gateway.config.upstreams import UpstreamConfig
from gateway.core.cache import TtlCache
from gateway.core.contracts import StreamedResponse
from gateway.core.errors import ErrorKind, GatewayError, malformed, unsupported
from gateway.core.record import PASSTHROUGH_REQUEST_ONLY, PASSTHROUGH_TRANSLATED, PASSTHROUGH_VERBATIM
from gateway.core.types import (
    MODEL_CONFIG_OPERATION,
    InferRequest,
    InferResponse,
    ModelMetadata,
    OperationRequest,
    RawPayload,
    RequestContext,
    TensorSpec,
)
from gateway.protocols.http_upstream import HttpUpstreamClient
from gateway.protocols.v2_rest import codec
from gateway.protocols.v2_rest.flat import METADATA_TTL, encode_flat_request, flat_answer_items
from gateway.runtime.services import GatewayServices
from gateway.transport.http_client.pool import UpstreamHttp
from gateway.transport.http_client.reply import UpstreamReply as HttpReply  # renamed; the name here after the merge
from gateway.transport.http_server.sse import SseError, SseEvent, SseParser
from gateway.transport.upstream import (
    HOLD_LAST,
    parse_response_limit,
    parse_stream_relay,
    reading_reply,
    response_limit,
    without_addresses,
)

log = logging.getLogger(__name__)
BINARY_EXTENSION = "binary_tensor_data"
_REJECTS_BINARY = (400, 415, 422)  # how servers without the extension answer it
# How servers without the model-configuration endpoint answer it.
_NO_CONFIG_ENDPOINT = (404, 405, 501)
STREAMING_MODES = ("unary", "infer_stream", "generate_stream")
# A streamed reply's unread part waits in a buffer this big; past it the socket is not read.
STREAM_BUFFER_BYTES = 256 << 10
_NO_BINARY = memoryview(b"")


@dataclass(frozen=True, slots=True)
class RestUpstreamOptions:
    binary: str = "auto"  # auto | always | never
    max_connections: int = 64  # per endpoint
    max_response_bytes: int | None = None  # None: 4 x limits.max_request_bytes
    # A stream's request: unary (one /infer) | infer_stream (MLServer's SSE endpoint) | generate_stream (Triton's).
    streaming: str = "unary"
    stream_relay: str = HOLD_LAST  # infer_stream's events: hold_last | immediate (gateway/protocols/upstream.py)


class V2RestClient(HttpUpstreamClient):
    http: UpstreamHttp | None = None

    @classmethod
    def parse_options(cls, node: Node) -> RestUpstreamOptions:
        return RestUpstreamOptions(
            binary=node.choice("binary", ("auto", "always", "never"), "auto"),
            max_connections=node.integer("max_connections", 64, minimum=1),
            max_response_bytes=parse_response_limit(node),
            streaming=node.choice("streaming", STREAMING_MODES, "unary"),
            stream_relay=parse_stream_relay(node),
        )

    def __init__(self, upstream: UpstreamConfig, endpoint: Address | None, services: GatewayServices) -> None:
        super().__init__(upstream, endpoint, services)
        self.options: RestUpstreamOptions = self.upstream.options or RestUpstreamOptions()
        self.max_response = response_limit(self.options.max_response_bytes, self.services)
        self.max_connections = self.options.max_connections
        # Whether this endpoint takes binary tensors; None until learned.
        self.binary: bool | None = {"always": True, "never": False}.get(self.options.binary)
        self._asked_metadata = False
        # generate_stream reads answers by the model's outputs (docs/protocols.md).
        self._metadata: TtlCache[ModelMetadata] = TtlCache(METADATA_TTL)

    # --- transport ---------------------------------------------------------------

    async def _send(self, method: str, path: str, body: bytes | bytearray | None = None,
                    headers: dict[str, str] | None = None, ctx: RequestContext | None = None) -> HttpReply:
        # Tensors barely compress and the upstream is usually near: the
        # transport asks for uncompressed replies (Accept-Encoding: identity).
        return await self.started().request(method, path, {**(headers or {}), **self.request_headers(ctx)}, body)

    def _error(self, reply: HttpReply) -> GatewayError:
        return codec.decode_error(reply.status, reply.body, self.label)

    @staticmethod
    def _model_path(model: str, version: str) -> str:
        path = f"/v2/models/{quote(model, safe='')}"
        return path + f"/versions/{quote(version, safe='')}" if version else path

    # --- binary or JSON ----------------------------------------------------------

    async def _learn_binary(self, ctx: RequestContext) -> None:
        """Read the server's extensions once; leave ``binary`` unknown if the
        metadata cannot be read (then a failed attempt decides)."""
        reply = await self._send("GET", "/v2", ctx=ctx)
        if reply.status != 200:
            return
        try:
            extensions = orjson.loads(reply.body).get("extensions")
        except (orjson.JSONDecodeError, AttributeError):
            return
        if isinstance(extensions, list):
            self.binary = BINARY_EXTENSION in extensions
            log.info("upstream %s: binary tensor extension %s", self.endpoint_label,
                     "listed, sending binary" if self.binary else "not listed, sending JSON")

    async def _infer_once(self, request: InferRequest, binary: bool, raw: RawPayload | None,
                          ctx: RequestContext) -> HttpReply:
        """One attempt: the client's own bytes (``raw``), or the request
        encoded with binary or JSON tensors."""
        if raw is not None:
            body: bytes | bytearray = raw.body
            headers = {"Content-Type": raw.content_type, **raw.headers}
        else:
            body, headers = codec.encode_infer_request(request, binary)
        path = self._model_path(request.model_name, request.model_version) + "/infer"
        return await self._send("POST", path, body, headers, ctx)

    # --- pass-through --------------------------------------------------------------

    def _forwardable(self, request: InferRequest) -> RawPayload | None:
        """The client's body, if it can go to this endpoint unchanged."""
        raw = request.raw
        if raw is None or raw.protocol != codec.PROTOCOL or not self.upstream.passthrough:
            return None
        if codec.HEADER_LENGTH in raw.headers and self.binary is False:
            return None  # binary tensors to a JSON-only server: translate
        return raw

    def _answers_as_asked(self, request: InferRequest) -> bool:
        """Whether the endpoint's answer to the client's unchanged request is
        what the client asked for: a server with Triton's binary extension
        selects outputs and writes binary ones itself; others (MLServer)
        are trusted only when the client asked for neither."""
        return self.binary is True or not (request.outputs or codec.binary_outputs_requested(request))

    def _raw_answer(self, reply: HttpReply) -> RawPayload:
        """The answer's bytes, once checked as translation would check them:
        a malformed answer is the upstream's fault (502), never the client's
        problem to parse. Nothing decoded is kept (binary tensors are read
        as views, small JSON ones are not made arrays)."""
        header_length = reply.headers.get(codec.HEADER_LENGTH)
        with reading_reply(self.label):
            codec.check_infer_response(reply.body, header_length, self.services.config.limits.max_tensor_elements)
        if header_length is None:
            return RawPayload(codec.PROTOCOL, reply.body, codec.JSON_TYPE)
        return RawPayload(codec.PROTOCOL, reply.body, codec.BINARY_TYPE, {codec.HEADER_LENGTH: header_length})

    # --- operations --------------------------------------------------------------

    async def infer(self, request: InferRequest, ctx: RequestContext) -> InferResponse:
        if self.binary is None and not self._asked_metadata:
            await self._learn_binary(ctx)
            self._asked_metadata = True
        raw = self._forwardable(request)
        binary = self.binary is not False
        reply = await self._infer_once(request, binary, raw, ctx)
        sent_binary = codec.HEADER_LENGTH in raw.headers if raw is not None else binary
        if self.binary is None and sent_binary:  # the metadata did not tell: learn from this attempt
            if reply.status == 200:
                self.binary = True
            elif reply.status in _REJECTS_BINARY:
                # Sent twice: said in the log, with the request's id (the access
                # log counts the attempt once: it is one try of the route's).
                log.info("request %s: upstream %s answered binary tensors with %d; sending it again as JSON",
                         ctx.request_id, self.endpoint_label, reply.status)
                json_reply = await self._infer_once(request, False, None, ctx)
                if json_reply.status == 200:
                    log.info("upstream %s rejected binary tensors with %d; sending JSON from now on",
                             self.endpoint_label, reply.status)
                    self.binary = False
                reply, raw = json_reply, None
        if reply.status != 200:
            raise self._error(reply)
        if raw is not None and self._answers_as_asked(request):
            self._note(ctx, PASSTHROUGH_VERBATIM)
            return InferResponse(request.model_name, request.model_version, request.id, raw=self._raw_answer(reply))
        if ctx.protocol == codec.PROTOCOL:  # a V2 REST client's request, translated at least one way
            self._note(ctx, PASSTHROUGH_REQUEST_ONLY if raw is not None else PASSTHROUGH_TRANSLATED)
        with reading_reply(self.label):
            return codec.decode_infer_response(reply.body, reply.headers.get(codec.HEADER_LENGTH),
                                               self.services.config.limits.max_tensor_elements)

    async def infer_stream(self, request: InferRequest, ctx: RequestContext) -> AsyncIterator[StreamedResponse]:
        """With ``streaming: infer_stream`` or ``generate_stream``: each
        server-sent event of the upstream's reply as a response. Events carry no
        final flag: with ``stream_relay: hold_last`` each response goes on
        when the next event (or the reply's end, which makes it final)
        arrives; with ``immediate`` at once, none final. A consumer that
        stops reading stops the socket being read (bounded buffer), so the server waits; closing
        this iterator early closes the connection, which ends the server's
        stream. An event is bounded by ``max_response_bytes``."""
        mode = self.options.streaming
        if mode == "unary":
            async for part in super().infer_stream(request, ctx):
                yield part
            return
        if mode == "generate_stream":
            # Triton's flat object both ways; its outputs are read by the model's metadata.
            metadata = await self._metadata.get((request.model_name, request.model_version), lambda: (
                self.model_metadata(request.model_name, request.model_version, ctx)))
            outputs = metadata.outputs
            body: bytes | bytearray = encode_flat_request(request.inputs, request.parameters)
            headers = {"Content-Type": codec.JSON_TYPE}

            def decode(data: bytes) -> InferResponse:
                return self._flat_answer(data, outputs)
        else:
            raw = self._forwardable(request)
            if raw is not None and codec.HEADER_LENGTH not in raw.headers:  # a JSON body goes as it is
                body, headers = raw.body, {"Content-Type": raw.content_type}
            else:  # events carry JSON: so do requests
                body, headers = codec.encode_infer_request(request, False)
            max_elements = self.services.config.limits.max_tensor_elements

            def decode(data: bytes) -> InferResponse:
                return codec.decode_infer_response(_event_json(data), None, max_elements)

        async for part in self._relay(self._model_path(request.model_name, request.model_version) + "/" + mode,
                                      {**headers, "Accept": "text/event-stream", **self.request_headers(ctx)},
                                      body, decode, ctx):
            yield part

    async def _relay(self, path: str, headers: dict[str, str], body: bytes | bytearray,
                     decode: Callable[[bytes], InferResponse], ctx: RequestContext) -> AsyncIterator[StreamedResponse]:
        """The events of one streamed exchange, decoded, flagged as
        ``stream_relay`` says (at once when the client needs no final flag:
        ``ctx.end_marked``)."""
        stream = await self.started().stream("POST", path, headers, body, buffer_bytes=STREAM_BUFFER_BYTES)
        try:
            if stream.status != 200:
                raise codec.decode_error(stream.status, await stream.read_all(64 << 10), self.label)
            parser = SseParser(self.max_response)
            held: InferResponse | None = None  # the last response is known when the reply ends
            try:
                while (piece := await stream.read()) is not None:
                    for event in self._events(parser, piece):
                        with reading_reply(self.label):
                            response = decode(event.data)
                        if self.options.stream_relay != HOLD_LAST or ctx.end_marked:
                            yield StreamedResponse(response)
                            continue
                        if held is not None:
                            yield StreamedResponse(held)
                        held = response
                if parser.pending:
                    raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                                       f"upstream {self.label} ended its event stream inside an event")
            except GatewayError:
                if held is not None:  # what came before the error is the client's, unflagged
                    pending, held = held, None
                    yield StreamedResponse(pending)
                raise
            if held is not None:
                yield StreamedResponse(held, final=True)
        finally:
            stream.close()

    def _flat_answer(self, data: bytes, outputs: tuple[TensorSpec, ...]) -> InferResponse:
        """One generate_stream event: a flat answer, or ``{"error": ...}``
        (the model failed after the reply's status was sent)."""
        obj = codec.load_json_object(data, "a generate_stream event")
        if "error" in obj and not any(spec.name == "error" for spec in outputs):
            # Mid-stream errors are not the proxy's to clean: addresses are cut here.
            words = without_addresses(str(obj["error"])[:512], self.endpoint)
            raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"upstream {self.label} sent an error event: {words}")
        items = flat_answer_items(obj, outputs)
        if not items:
            raise malformed("a generate_stream event names none of the model's outputs")
        name, version = obj.get("model_name", ""), obj.get("model_version", "")
        return InferResponse(
            model_name=name if isinstance(name, str) else "",
            model_version=version if isinstance(version, str) else "",
            outputs=codec.decode_tensors(items, _NO_BINARY, "output", self.services.config.limits.max_tensor_elements),
        )

    def _events(self, parser: SseParser, piece: bytes) -> list[SseEvent]:
        """The events ``piece`` completes; an error event raises its words."""
        try:
            events = parser.feed(piece)
        except SseError as exc:
            raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                               f"upstream {self.label} sent an unreadable event stream: {exc}") from None
        for event in events:
            if event.event == "error":
                words = without_addresses(event.data[:512].decode("utf-8", "replace"), self.endpoint)
                raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, f"upstream {self.label} sent an error event: "
                                   f"{words}")
        return events

    def _note(self, ctx: RequestContext, mode: str) -> None:
        ctx.record.passthrough = mode
        log.debug("infer %s on %s: %s", ctx.request_id, self.endpoint_label, mode)

    async def model_metadata(self, model: str, version: str, ctx: RequestContext) -> ModelMetadata:
        reply = await self._send("GET", self._model_path(model, version), ctx=ctx)
        if reply.status != 200:
            raise self._error(reply)
        with reading_reply(self.label):
            return codec.decode_model_metadata(reply.body)

    async def model_ready(self, model: str, version: str, ctx: RequestContext) -> bool:
        reply = await self._send("GET", self._model_path(model, version) + "/ready", ctx=ctx)
        if reply.status == 200:
            return True
        if reply.status in (400, 503):  # known but not ready (servers disagree on the code)
            return False
        raise self._error(reply)

    async def server_ready(self, ctx: RequestContext) -> bool:
        return (await self._send("GET", "/v2/health/ready", ctx=ctx)).status == 200

    async def list_models(self, ctx: RequestContext) -> list[str]:
        """The repository index (Triton's and MLServer's extension), if offered."""
        reply = await self._send("POST", "/v2/repository/index", b"{}", {"Content-Type": codec.JSON_TYPE}, ctx)
        if reply.status != 200:
            return []
        try:
            entries = orjson.loads(reply.body)
        except orjson.JSONDecodeError:
            return []
        if not isinstance(entries, list):
            return []
        return [e["name"] for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)]

    async def call_operation(self, operation: str, request: OperationRequest, ctx: RequestContext) -> Any:
        """``model_config``: Triton's ``GET .../config``; servers without it
        (MLServer, KServe) leave the gateway to synthesize one."""
        if operation != MODEL_CONFIG_OPERATION or not isinstance(request, OperationRequest):
            return await super().call_operation(operation, request, ctx)
        inner = request.request
        reply = await self._send("GET", self._model_path(inner.model_name, inner.model_version) + "/config", ctx=ctx)
        if reply.status in _NO_CONFIG_ENDPOINT:
            raise unsupported(f"upstream {self.label} offers no model configuration (it answered {reply.status})")
        if reply.status != 200:
            raise self._error(reply)
        with reading_reply(self.label):
            return codec.load_json_object(reply.body, "the model configuration")


def _event_json(data: bytes) -> bytes:
    """An event's JSON without what MLServer adds that V2 responses do not
    have: nulls for absent fields, and its transport headers as the
    parameter ``headers`` (its unary answers send them as HTTP headers)."""
    if b"null" not in data and b'"headers"' not in data:
        return data
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data  # the codec says what is wrong with it
    if not isinstance(obj, dict):
        return data
    cleaned = {key: value for key, value in obj.items() if value is not None}
    parameters = cleaned.get("parameters")
    if isinstance(parameters, dict) and isinstance(parameters.get("headers"), dict):
        cleaned["parameters"] = {k: v for k, v in parameters.items() if k != "headers"}
    outputs = cleaned.get("outputs")
    if isinstance(outputs, list):
        cleaned["outputs"] = [{k: v for k, v in item.items() if v is not None} if isinstance(item, dict) else item
                              for item in outputs]
    return orjson.dumps(cleaned)
