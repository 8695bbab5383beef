"""A CloudEvents sink in its own process: every POST is parsed by the
`cloudevents` SDK (binary content mode, JSON data) and kept; ``GET /events``
returns what it parsed, in order, as JSON: ``[{"attributes": {...}, "data":
...}]`` (the time as text), and ``GET /rejected`` the POSTs the SDK refused.

``python -m peers.cloudevents_sink PORT_FILE [--hang]`` (with ``tests`` on
PYTHONPATH) binds 127.0.0.1:0 and writes its port to PORT_FILE. With
``--hang`` it reads each POST and never answers it (a sink that hangs);
the reads still count in ``GET /events``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cloudevents.core.bindings.http import HTTPMessage, from_binary_event

HANG_SECONDS = 120.0  # a hung POST is let go after this even if nobody closes it


class Sink(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hang: bool) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.hang = hang
        self.lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self.rejected: list[str] = []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the gateway's sender expects
    server: Sink

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            event = from_binary_event(HTTPMessage(dict(self.headers.items()), body))
            parsed = {"attributes": {k: (v.isoformat() if hasattr(v, "isoformat") else v)
                                     for k, v in event.get_attributes().items()},
                      "data": event.get_data(), "path": self.path}
        except Exception as exc:  # the SDK refused it: the test says why
            with self.server.lock:
                self.server.rejected.append(f"{type(exc).__name__}: {exc}")
            self._answer(400, b"{}")
            return
        with self.server.lock:
            self.server.events.append(parsed)
        if self.server.hang:
            time.sleep(HANG_SECONDS)
            return
        self._answer(202, b"")

    def do_GET(self) -> None:
        with self.server.lock:
            listed = self.server.events if self.path == "/events" else self.server.rejected
            self._answer(200, json.dumps(listed).encode())

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main() -> int:
    port_file = Path(sys.argv[1])
    sink = Sink(hang="--hang" in sys.argv[2:])
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(sink.server_address[1]))
    tmp.rename(port_file)
    sink.serve_forever(poll_interval=0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
