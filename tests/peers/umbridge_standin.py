"""A UM-Bridge stand-in that records the exact bytes of every call it gets
and answers Evaluate with bytes a test chose, so pass-through tests can
compare both byte for byte and feed the gateway broken answers.

The reference server (peers/umbridge_peer.py) cannot be told what bytes to
answer, nor report what bytes it got. This one serves the protocol's
metadata calls for models a test declares (sizes, Evaluate only) and runs
in a thread of the test process on 127.0.0.1, port 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from peers.threaded_http import ThreadedStandin


@dataclass(frozen=True)
class Seen:
    path: str
    body: bytes


@dataclass
class StandinModel:
    input_sizes: list[int]
    output_sizes: list[int]
    answer: bytes = b""  # Evaluate's answer body
    status: int = 200
    answers: list[bytes] = field(default_factory=list)  # if set, one per call, in order (then `answer`)


class UmbridgeStandin(ThreadedStandin):
    def __init__(self) -> None:
        super().__init__(_Handler)
        self.models: dict[str, StandinModel] = {}
        self.seen: list[Seen] = []

    def evaluations(self) -> list[bytes]:
        with self.lock:
            return [s.body for s in self.seen if s.path == "/Evaluate"]


class _Handler(BaseHTTPRequestHandler):
    server: UmbridgeStandin
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, value: Any) -> None:
        self._reply(200, json.dumps(value).encode())

    def do_GET(self) -> None:
        if self.path == "/Info":
            self._json({"protocolVersion": 1.0, "models": list(self.server.models)})
        else:
            self._reply(404, b'{"error": {"type": "NotFound", "message": "no such path"}}')

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        server = self.server
        with server.lock:
            server.seen.append(Seen(self.path, body))
        try:
            name = json.loads(body)["name"]
            model = server.models[name]
        except (ValueError, KeyError, TypeError):
            self._reply(400, b'{"error": {"type": "ModelNotFound", "message": "no such model"}}')
            return
        if self.path == "/InputSizes":
            self._json({"inputSizes": model.input_sizes})
        elif self.path == "/OutputSizes":
            self._json({"outputSizes": model.output_sizes})
        elif self.path == "/ModelInfo":
            self._json({"support": {"Evaluate": True, "Gradient": False, "ApplyJacobian": False,
                                    "ApplyHessian": False}})
        elif self.path == "/Evaluate":
            with server.lock:
                answer = model.answers.pop(0) if model.answers else model.answer
            self._reply(model.status, answer)
        else:
            self._reply(400, b'{"error": {"type": "UnsupportedFeature", "message": "not here"}}')
