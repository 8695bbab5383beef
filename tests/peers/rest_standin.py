"""A V2 REST stand-in that records the exact bytes it receives and answers
bytes a test chose, so pass-through tests can compare both byte for byte.

No real model server can be told what bytes to answer, or report what
bytes it got, so this one stands in for Triton (``binary=True``: lists
``binary_tensor_data`` and takes binary bodies) or for a JSON-only server
like MLServer (``binary=False``: lists no extensions, answers a binary
body with 422 as MLServer 1.7.1 does). It runs in a thread of the test
process on 127.0.0.1, port 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from peers.threaded_http import ThreadedStandin

HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class Seen:
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes


@dataclass(frozen=True)
class Answer:
    body: bytes
    status: int = 200
    header_length: int | None = None  # binary answers: the JSON head's length


class RecordingUpstream(ThreadedStandin):
    def __init__(self, binary: bool) -> None:
        super().__init__(_Handler)
        self.binary = binary
        self.answers: dict[str, Answer] = {}  # by model name in the path
        self.metadata: dict[str, bytes] = {}  # model metadata bodies (GET /v2/models/NAME), by model name
        self.failures: dict[str, int] = {}  # model -> how many more infers answer 503
        self.seen: list[Seen] = []

    def seen_for(self, model: str) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.path.split("/")[3] == model]


class _Handler(BaseHTTPRequestHandler):
    server: RecordingUpstream
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def _reply(self, status: int, body: bytes, header_length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if header_length is None else "application/octet-stream")
        if header_length is not None:
            self.send_header(HEADER_LENGTH, str(header_length))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v2":
            extensions = ["binary_tensor_data"] if self.server.binary else []
            self._reply(200, json.dumps({"name": "recorder", "version": "1", "extensions": extensions}).encode())
        elif self.path.endswith("/ready"):
            self._reply(200, b"")
        elif self.path.startswith("/v2/models/") and self.path.split("/")[3] in self.server.metadata:
            self._reply(200, self.server.metadata[self.path.split("/")[3]])
        else:
            self._reply(404, b'{"error": "no such route"}')

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        model = self.path.split("/")[3]
        server = self.server
        with server.lock:
            server.seen.append(Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            failing = server.failures.get(model, 0)
            if failing:
                server.failures[model] = failing - 1
        if HEADER_LENGTH in self.headers and not server.binary:
            self._reply(422, b'{"error": "binary tensors are not supported"}')
        elif failing:
            self._reply(503, b'{"error": "busy, try again"}')
        elif model in server.answers:
            answer = server.answers[model]
            self._reply(answer.status, answer.body, answer.header_length)
        else:  # a plain answer naming the model, for requests whose answer does not matter
            self._reply(200, json.dumps({"model_name": model, "outputs": [
                {"name": "OUT", "datatype": "INT32", "shape": [1], "data": [len(body)]}]}).encode())
