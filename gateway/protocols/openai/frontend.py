"""OpenAI listener: OpenAI clients to V2 text models (the mapping per
route: mapping.py; docs/protocols.md, "OpenAI").

Every answer, errors included, is JSON in OpenAI's form (codec.py,
errors.py). ``stream: true`` answers server-sent events, one chunk per
upstream response as it comes, then a chunk with the finish reason, the
usage chunk when ``stream_options.include_usage`` asks for it, and
``data: [DONE]``; an error after the first chunk is an event holding the
error object (before it, the usual error answer). Generation always goes
through the data plane's ``infer_stream``, so decoupled models (Triton's
vLLM and TensorRT-LLM models) and plain ones serve both forms; without
``stream`` the responses' texts are joined.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from gateway.config.listeners import ListenerConfig
from gateway.config.node import Node
from gateway.core.contracts import StreamedResponse
from gateway.core.errors import GatewayError, invalid
from gateway.core.record import REQUEST_ID_HEADER
from gateway.core.types import InferRequest, RequestContext
from gateway.dataplane.routing import Route
from gateway.protocols.base import DataPlaneApi
from gateway.protocols.http_frontend import AiohttpRequest, HttpFrontend
from gateway.protocols.openai import codec, errors, mapping
from gateway.runtime.budget import admit_json
from gateway.runtime.services import GatewayServices
from gateway.transport.cycle import StreamSlots
from gateway.transport.http_server.aiohttp_app import aiohttp_reply, error_middleware
from gateway.transport.http_server.exchange import Handler, HttpReply, HttpRequest, json_reply
from gateway.transport.http_server.streamed import StreamedAnswer

log = logging.getLogger(__name__)

PROTOCOL = codec.PROTOCOL
DEFAULT_MAX_MESSAGES = 256
DEFAULT_MAX_TOKENS = 4096
DEFAULT_DEFAULT_MAX_TOKENS = 256
DEFAULT_MAX_EMBEDDING_INPUTS = 2048
# What encoding one embedding value can take as JSON text, for the memory budget.
_FLOAT_TEXT_BYTES = 24


DEFAULT_LIMITS = codec.Limits(DEFAULT_MAX_MESSAGES, DEFAULT_MAX_TOKENS, DEFAULT_DEFAULT_MAX_TOKENS,
                              DEFAULT_MAX_EMBEDDING_INPUTS)


def parse_listener_options(node: Node) -> codec.Limits:
    """The listener's own keys: its bounds on one request."""
    max_tokens = node.integer("max_tokens", DEFAULT_MAX_TOKENS, minimum=1)
    bound = max_tokens if isinstance(max_tokens, int) else DEFAULT_MAX_TOKENS
    default_max_tokens = node.integer("default_max_tokens", min(DEFAULT_DEFAULT_MAX_TOKENS, bound), minimum=1)
    if isinstance(default_max_tokens, int) and default_max_tokens > bound:
        node.error(f"must be at most max_tokens ({bound}), got {default_max_tokens}", "default_max_tokens")
    limits = codec.Limits(node.integer("max_messages", DEFAULT_MAX_MESSAGES, minimum=1), bound,
                          default_max_tokens, node.integer("max_embedding_inputs", DEFAULT_MAX_EMBEDDING_INPUTS,
                                                           minimum=1))
    return limits


class WordCount:
    """Whitespace words of a text that comes in pieces (a stream's usage)."""

    __slots__ = ("_in_word", "count")

    def __init__(self) -> None:
        self.count = 0
        self._in_word = False

    def add(self, text: str) -> None:
        if not text:
            return
        words = len(text.split())  # in C: a long text holds the loop no longer than a copy
        if words and self._in_word and not text[0].isspace():
            words -= 1  # the word the last piece ended in goes on
        self.count += words
        self._in_word = not text[-1].isspace()


class OpenAiFrontend(HttpFrontend):
    status_kinds = errors.KIND_OF_HTTP_STATUS

    @classmethod
    def parse_options(cls, node: Node) -> codec.Limits:
        return parse_listener_options(node)

    @classmethod
    def parse_route_options(cls, node: Node, base_dir: Path) -> mapping.RouteOptions:
        return mapping.parse_route_options(node)

    def __init__(self, listener: ListenerConfig, dataplane: DataPlaneApi, services: GatewayServices) -> None:
        super().__init__(listener, dataplane, services)
        options = self.listener.options
        self.limits = options if isinstance(options, codec.Limits) else DEFAULT_LIMITS
        self._streams = StreamSlots(self.listener.name, PROTOCOL, services)

    def error_reply(self, error: GatewayError, status: int | None) -> HttpReply:
        if status is None:
            status, body = codec.encode_error(error)
        else:
            body = codec.error_body(error, status)
        return json_reply(body, status)

    def handlers(self) -> list[tuple[str, str, Handler]]:
        return [("GET", "/v1/models", self.models), ("GET", "/v1/models/{model}", self.model),
                ("POST", "/v1/embeddings", self.embeddings)]

    def build_app(self) -> web.Application:
        app = self.new_app([error_middleware(self.render_error, self.status_kinds)])  # OpenAI errors, no text pages
        self.add_routes(app)
        # Served by aiohttp only: whether the answer streams is known from the body.
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        return app

    def _route_options(self, route: Route) -> mapping.RouteOptions:
        options = route.config.options.get(PROTOCOL)
        return options if isinstance(options, mapping.RouteOptions) else mapping.DEFAULT_OPTIONS

    async def _body(self, request: HttpRequest) -> bytes | bytearray:
        """The body under the listener's size limit, nesting checked and
        what parsing builds charged to the memory budget."""
        body = await request.read()
        await admit_json(body, request.reservation(), self.services.offload, self.services.config.limits,
                         "the request body")
        return body

    # --- models ---------------------------------------------------------------

    async def models(self, request: HttpRequest) -> HttpReply:
        ctx = request.ctx
        names = await self.dataplane.list_models(ctx)
        ctx.record.model = ctx.record.version = ctx.record.route = ""  # a listing names no model
        return json_reply(codec.encode_models(names))

    async def model(self, request: HttpRequest) -> HttpReply:
        name = request.params["model"]
        await self.dataplane.model_ready(name, "", request.ctx)  # an unknown model: 404
        return json_reply(codec.encode_model(name))

    # --- embeddings -------------------------------------------------------------

    async def embeddings(self, request: HttpRequest) -> HttpReply:
        ctx = request.ctx
        body = await self._body(request)
        offload = self.services.offload
        asked = await offload.run(len(body), codec.decode_embeddings, body, self.limits)
        del body
        options = self._route_options(self.dataplane.resolve(asked.model, "", ctx))
        infer_request = mapping.embeddings_request(asked.model, asked.texts, options, ctx.request_id)
        response = await self.dataplane.infer(infer_request, ctx)
        infer_request.inputs = []
        vectors = mapping.vectors_of(response, options, len(asked.texts))
        if asked.dimensions is not None and asked.dimensions != vectors.shape[1]:
            raise codec.FieldError("dimensions", f"model '{asked.model}' answers {vectors.shape[1]} dimensions, "
                                   f"not {asked.dimensions}")
        size = 256 + vectors.size * _FLOAT_TEXT_BYTES
        request.reservation().grow(size)
        answer = await offload.run(size, codec.encode_embeddings, asked, vectors, mapping.reported_tokens(response)[0])
        return json_reply(answer, 200, {REQUEST_ID_HEADER: ctx.request_id})

    # --- chat and completions ------------------------------------------------------

    async def chat_completions(self, raw: web.Request) -> web.StreamResponse:
        return await self._generate(raw, codec.decode_chat)

    async def completions(self, raw: web.Request) -> web.StreamResponse:
        return await self._generate(raw, codec.decode_completion)

    async def _generate(self, raw: web.Request,
                        decode: Callable[[bytes | bytearray, codec.Limits], codec.TextRequest]) -> web.StreamResponse:
        request = AiohttpRequest(self, raw)
        ctx = request.ctx
        body = await self._body(request)
        asked = await self.services.offload.run(len(body), decode, body, self.limits)
        del body
        options = self._route_options(self.dataplane.resolve(asked.model, "", ctx))
        if options.api == "embeddings":
            raise invalid(f"model '{asked.model}' is an embeddings model (its route's options.openai.api); "
                          "call /v1/embeddings")
        prompt = mapping.render_prompt(asked.messages, options) if asked.messages is not None else asked.prompt
        infer_request = mapping.text_request(asked, prompt, options, ctx.request_id)
        answer_id = ("chatcmpl-" if asked.messages is not None else "cmpl-") + ctx.request_id
        created = int(time.time())
        prompt_tokens = codec.count_tokens(prompt)
        if asked.stream:
            return await self._stream(raw, ctx, asked, infer_request, options, answer_id, created, prompt_tokens)
        reservation = request.reservation()
        pieces: list[str] = []
        completion_tokens: int | None = None

        async def deliver(part: StreamedResponse) -> None:
            nonlocal prompt_tokens, completion_tokens
            if mapping.carries_text(part.response, options):
                text = mapping.text_of(part.response, options)
                reservation.grow(2 * len(text))  # the text, and its copy in the answer
                pieces.append(text)
            reported_prompt, reported_completion = mapping.reported_tokens(part.response)
            if reported_prompt is not None:
                prompt_tokens = reported_prompt
            if reported_completion is not None:
                completion_tokens = reported_completion

        await self.dataplane.infer_stream(infer_request, ctx, deliver)
        text = "".join(pieces)
        counted = codec.count_tokens(text) if completion_tokens is None else completion_tokens
        finish = "length" if counted >= asked.max_tokens else "stop"
        answer = await self.services.offload.run(len(text), codec.encode_text_answer, asked, answer_id, created,
                                                 text, finish, prompt_tokens, counted)
        return await aiohttp_reply(raw, HttpReply(200, [answer], codec.JSON_TYPE,
                                                  {REQUEST_ID_HEADER: ctx.request_id}))

    async def _stream(self, raw: web.Request, ctx: RequestContext, asked: codec.TextRequest,
                      infer_request: InferRequest, options: mapping.RouteOptions, answer_id: str, created: int,
                      prompt_tokens: int) -> web.StreamResponse:
        self._streams.take()
        try:
            return await self._send_stream(raw, ctx, asked, infer_request, options, answer_id, created,
                                           prompt_tokens)
        finally:
            self._streams.give_back()

    async def _send_stream(self, raw: web.Request, ctx: RequestContext, asked: codec.TextRequest,
                           infer_request: InferRequest, options: mapping.RouteOptions, answer_id: str, created: int,
                           prompt_tokens: int) -> web.StreamResponse:
        stream = StreamedAnswer(raw, ctx)
        words = WordCount()
        budget = self.services.budget

        async def deliver(part: StreamedResponse) -> None:
            if not mapping.carries_text(part.response, options):
                return
            text = mapping.text_of(part.response, options)
            held = budget.reserve()  # the chunk, until it is written
            try:
                held.grow(3 * len(text) + 256)
                chunk = codec.encode_chunk(asked, answer_id, created, text, None, first=stream.events == 0)
                words.add(text)
                await stream.send(chunk)
            finally:
                held.release()

        ctx.end_marked = True  # chunks carry no final flag: the stream's end tells it
        try:
            await self.dataplane.infer_stream(infer_request, ctx, deliver)
        except Exception as exc:
            await stream.failed(exc, codec.encode_stream_error)
            return await stream.end()
        finally:
            stream.observe(self.services)
        finish = "length" if words.count >= asked.max_tokens else "stop"
        tail = [codec.encode_chunk(asked, answer_id, created, None, finish, first=stream.events == 0)]
        if asked.include_usage:
            tail.append(codec.encode_usage_chunk(asked, answer_id, created, prompt_tokens, words.count))
        tail.append(codec.DONE_EVENT)
        return await stream.end(b"".join(tail))
