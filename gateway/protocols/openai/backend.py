"""The ``openai`` upstream: one endpoint of an OpenAI-compatible server
(vLLM, TGI, Ollama, LiteLLM, KServe's ``/openai``) behind V2 clients.

A V2 request for a text model goes to ``{base_path}/v1/completions``,
``/v1/chat/completions`` or ``/v1/embeddings``, as the upstream's ``api``
options say for its model (upstream_options.py); upstream_codec.py maps
Triton's LLM conventions both ways. A stream's request (ModelStreamInfer,
``generate_stream``) is sent with ``stream: true`` and each server-sent
chunk that carries text becomes a response holding that new text; the
last is held until ``[DONE]`` so it can be marked final (at once when the
client needs no final flag). The API key comes from the environment
variable ``api_key_env``, read when the client is built, and goes only
into the Authorization header: errors drop a refused key's words and
redact the key from any other.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import orjson

from gateway.config.address import Address
from gateway.config.auth import AUTHORIZATION, BEARER
from gateway.config.node import Node
from gateway.config.upstreams import UpstreamConfig
from gateway.core.addresses import without_addresses
from gateway.core.cache import TtlCache
from gateway.core.contracts import StreamedResponse
from gateway.core.errors import ErrorKind, GatewayError, model_not_found
from gateway.core.limits import BYTES_ELEMENT_COST
from gateway.core.types import InferRequest, InferResponse, ModelMetadata, RequestContext
from gateway.protocols.http_upstream import HttpUpstreamClient
from gateway.protocols.openai import upstream_codec as codec
from gateway.protocols.openai.upstream_options import EMBEDDINGS, OpenAiUpstreamOptions, parse_upstream_options
from gateway.runtime.services import GatewayServices
from gateway.transport.http_client.reply import UpstreamReply
from gateway.transport.http_server.sse import SseError, SseParser
from gateway.transport.upstream import reading_reply, response_limit

# Seconds the server's model list is reused for metadata and readiness.
MODEL_LIST_TTL = 10.0
# A streamed reply's unread part waits in a buffer this big; past it the socket is not read.
STREAM_BUFFER_BYTES = 256 << 10
_ERROR_BODY_BYTES = 64 << 10  # read of an error answer, or of what follows [DONE]


class OpenAiClient(HttpUpstreamClient):

    @classmethod
    def parse_options(cls, node: Node) -> OpenAiUpstreamOptions:
        return parse_upstream_options(node)

    def __init__(self, upstream: UpstreamConfig, endpoint: Address | None, services: GatewayServices) -> None:
        super().__init__(upstream, endpoint, services)
        self.options: OpenAiUpstreamOptions = self.upstream.options or OpenAiUpstreamOptions()
        self.max_response = response_limit(self.options.max_response_bytes, services)
        self.max_connections = self.options.max_connections
        self._secrets: tuple[str, ...] = ()
        if self.options.api_key_env:
            key = os.environ.get(self.options.api_key_env, "").strip()
            self.credentials = {**self.credentials, AUTHORIZATION: f"{BEARER} {key}"}
            self._secrets = (key,)
        self._models: TtlCache[list[str]] = TtlCache(MODEL_LIST_TTL, max_entries=1)

    # --- transport ---------------------------------------------------------------

    def _headers(self, ctx: RequestContext | None, body: bool) -> dict[str, str]:
        headers = {"Content-Type": codec.JSON_TYPE} if body else {}
        return {**headers, **self.request_headers(ctx)}

    async def _send(self, method: str, path: str, body: bytes | None = None,
                    ctx: RequestContext | None = None) -> UpstreamReply:
        return await self.started().request(method, self.options.base_path + path,
                                             self._headers(ctx, body is not None), body)

    def _error(self, status: int, body: bytes | bytearray) -> GatewayError:
        return codec.decode_error(status, body, self.label, self._secrets)

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """The codec's words about a bad answer, naming this upstream and no address or secret."""
        with reading_reply(self.label):
            try:
                yield
            except GatewayError as error:
                if error.kind is not ErrorKind.UPSTREAM_BAD_RESPONSE:
                    raise
                words = without_addresses(error.message, self.endpoint)
                for secret in self._secrets:
                    words = words.replace(secret, "[redacted]")
                raise GatewayError(error.kind, f"upstream {self.label}: {words}") from None

    # --- inference -----------------------------------------------------------------

    @staticmethod
    def _reading_cost(request: InferRequest) -> int:
        """What reading the request's elements costs, for the offload pool
        (n texts are a loop over n elements: off the event loop when n is large)."""
        return BYTES_ELEMENT_COST * sum(int(tensor.data.size) for tensor in request.inputs)

    async def infer(self, request: InferRequest, ctx: RequestContext) -> InferResponse:
        api = self.options.api_of(request.model_name)
        offload = self.services.offload
        if api == EMBEDDINGS:
            body, count = await offload.run(self._reading_cost(request), codec.encode_embeddings_request, request)
            reply = await self._send("POST", codec.path_of(api), body, ctx)
            if reply.status != 200:
                raise self._error(reply.status, reply.body)
            with self._reading():
                matrix, usage = await offload.run(len(reply.body), codec.decode_embeddings, reply.body, count,
                                                  self.services.config.limits.max_tensor_elements)
            return codec.embeddings_response(request, matrix, usage)
        body = await offload.run(self._reading_cost(request), codec.encode_text_request, request, api, False)
        reply = await self._send("POST", codec.path_of(api), body, ctx)
        if reply.status != 200:
            raise self._error(reply.status, reply.body)
        with self._reading():
            text, usage = await offload.run(len(reply.body), codec.decode_text_answer, reply.body, api)
        return codec.text_response(request, text, usage)

    async def infer_stream(self, request: InferRequest, ctx: RequestContext) -> AsyncIterator[StreamedResponse]:
        """Each chunk's new text as a response (see the module's words).
        A consumer that stops reading stops the socket being read (bounded
        buffer); closing this iterator early closes the connection, which
        ends the server's stream. An event is bounded by ``max_response_bytes``."""
        api = self.options.api_of(request.model_name)
        if api == EMBEDDINGS or not codec.wants_stream(request):
            yield StreamedResponse(await self.infer(request, ctx), final=True)
            return
        body = await self.services.offload.run(self._reading_cost(request), codec.encode_text_request, request, api,
                                               True)
        headers = {**self._headers(ctx, True), "Accept": "text/event-stream"}
        stream = await self.started().stream("POST", self.options.base_path + codec.path_of(api), headers, body,
                                              buffer_bytes=STREAM_BUFFER_BYTES)
        try:
            if stream.status != 200:
                raise self._error(stream.status, await stream.read_all(_ERROR_BODY_BYTES))
            parser = SseParser(self.max_response)
            held: InferResponse | None = None  # the last response is known at [DONE]
            sent = False
            done = False
            try:
                while not done and (piece := await stream.read()) is not None:
                    for text in self._texts(parser, piece, api):
                        if text is None:
                            done = True
                            break
                        response = codec.text_response(request, text)
                        if ctx.end_marked:
                            sent = True
                            yield StreamedResponse(response)
                            continue
                        if held is not None:
                            sent = True
                            yield StreamedResponse(held)
                        held = response
                if not done:
                    raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                                       f"upstream {self.label} ended its stream without [DONE]")
                # The reply's end follows [DONE]: read it so the connection is reused (bounded; past it, closed).
                await stream.read_all(_ERROR_BODY_BYTES)
            except GatewayError:
                if held is not None:  # what came before the error is the client's, unflagged
                    pending, held = held, None
                    yield StreamedResponse(pending)
                raise
            if held is not None or not sent:  # an answer without text is one empty, final response
                yield StreamedResponse(held or codec.text_response(request, ""), final=True)
        finally:
            stream.close()

    def _texts(self, parser: SseParser, piece: bytes, api: str) -> list[str | None]:
        """The new texts of the chunks ``piece`` completes (chunks without
        text skipped); None marks ``[DONE]``."""
        try:
            events = parser.feed(piece)
        except SseError as exc:
            raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                               f"upstream {self.label} sent an unreadable event stream: {exc}") from None
        texts: list[str | None] = []
        for event in events:
            if event.data.strip() == codec.DONE:
                texts.append(None)
                break
            with self._reading():
                text = codec.decode_chunk(event.data, api)
            if text:
                texts.append(text)
        return texts

    # --- models --------------------------------------------------------------------

    async def _known(self, model: str, ctx: RequestContext) -> None:
        """Raises MODEL_NOT_FOUND for a model the server does not list (ids
        may be globs: LiteLLM lists ``*`` for a wildcard route; a server
        that lists none is taken at its word when called)."""
        models = await self._models.get("", lambda: self.list_models(ctx))
        if models and model not in models and not any(fnmatch.fnmatchcase(model, name) for name in models):
            raise model_not_found(model)

    async def model_metadata(self, model: str, version: str, ctx: RequestContext) -> ModelMetadata:
        await self._known(model, ctx)
        return codec.model_metadata(model, self.options.api_of(model))

    async def model_ready(self, model: str, version: str, ctx: RequestContext) -> bool:
        await self._known(model, ctx)
        return True

    async def server_ready(self, ctx: RequestContext) -> bool:
        return (await self._send("GET", "/v1/models", ctx=ctx)).status == 200

    async def list_models(self, ctx: RequestContext) -> list[str]:
        """The ids of ``GET /v1/models``; empty when it cannot be read."""
        reply = await self._send("GET", "/v1/models", ctx=ctx)
        if reply.status != 200:
            raise self._error(reply.status, reply.body)
        try:
            items = orjson.loads(reply.body).get("data")
        except (orjson.JSONDecodeError, AttributeError):
            return []
        if not isinstance(items, list):
            return []
        return [item["id"] for item in items if isinstance(item, dict) and isinstance(item.get("id"), str)]
