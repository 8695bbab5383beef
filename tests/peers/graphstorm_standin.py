"""A stand-in GraphStorm real-time endpoint, run as its own process.

A real endpoint needs DGL, PyTorch and SageMaker, none of which can run
here. This one follows the documented contract (SageMaker container paths,
the gs-realtime-v0.1 payload, the response envelope, the status codes and
``request_uid``) with the standard library only, and shares no code with
the gateway, so tests of the gateway's ``graphstorm`` upstream check the
gateway against an independent reading of the contract.

Its "model" needs the node features given by ``--require TYPE:FEATURE``
(like a trained model's feature list) and predicts ``--classes`` softmax
probabilities from a hash of each target. ``GET /last`` tells what the last
``/invocations`` body was (sha256, length, content type), so tests can
check that bytes were forwarded unchanged. A payload with
``"standin_fail": true`` makes it answer status_code 500.

    python graphstorm_standin.py --port-file PATH [--port N] [--require movie:title] [--classes 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

NODE_TASKS = ("node_classification", "node_regression")


def envelope(code: int, uid: str, error: str = "", data: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"status_code": code, "request_uid": uid,
            "message": "Request processed successfully." if code == 200 else "",
            "error": error, "data": data or {}}


def probabilities(key: str, classes: int) -> list[float]:
    digest = hashlib.sha256(key.encode()).digest()
    logits = [digest[i] / 64.0 for i in range(classes)]
    top = max(logits)
    exps = [math.exp(v - top) for v in logits]
    total = sum(exps)
    return [v / total for v in exps]


class Endpoint:
    def __init__(self, required: dict[str, list[str]], classes: int) -> None:
        self.required = required
        self.classes = classes
        self.last: dict[str, Any] = {}
        self.lock = threading.Lock()

    def invoke(self, body: bytes, content_type: str | None) -> dict[str, Any]:
        with self.lock:
            self.last = {"sha256": hashlib.sha256(body).hexdigest(), "length": len(body),
                         "content_type": content_type}
        if content_type != "application/json":
            return envelope(400, "", f"Unsupported content type: {content_type}")
        try:
            payload = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            return envelope(400, "", f"JSON format error: {exc}")
        uid = hashlib.sha256(body).hexdigest()[-16:]
        if not isinstance(payload, dict):
            return envelope(400, uid, "payload must be an object")
        task = payload.get("gml_task")
        if task not in NODE_TASKS:
            return envelope(421, uid, f"task {task} is not served")
        targets = payload.get("targets")
        if not targets:
            return envelope(401, uid, "missing targets")
        if not isinstance(targets, list) or not all(
                isinstance(t, dict) and "node_type" in t and "node_id" in t for t in targets):
            return envelope(400, uid, "bad targets")
        graph = payload.get("graph")
        if not isinstance(graph, dict) or not isinstance(graph.get("nodes"), list) \
                or not isinstance(graph.get("edges"), list):
            return envelope(411, uid, "graph construction failed")
        ids: dict[str, set[str]] = {}
        features: dict[str, set[str]] = {}
        for node in graph["nodes"]:
            if not isinstance(node, dict) or "node_type" not in node or "node_id" not in node:
                return envelope(411, uid, "graph construction failed: bad node")
            ids.setdefault(node["node_type"], set()).add(str(node["node_id"]))
            features.setdefault(node["node_type"], set()).update(node.get("features") or {})
        for node_type, names in self.required.items():
            for name in names:
                if node_type in features and name not in features[node_type]:
                    return envelope(404, uid, f"Missing node feature {name} of {node_type}")
        if payload.get("standin_fail") is True:
            return envelope(500, uid, "Internal Server Error: stand-in asked to fail")
        grouped: dict[str, list[dict[str, Any]]] = {node_type: [] for node_type in ids}
        for target in targets:
            node_type, node_id = target["node_type"], target["node_id"]
            if node_type not in ids:
                return envelope(403, uid, f"target node type {node_type} not in graph")
            if str(node_id) not in ids[node_type]:
                return envelope(404, uid, f"target node id {node_id} not in graph")
            prediction = probabilities(f"{node_type}/{node_id}", self.classes)
            if task == "node_regression":
                prediction = [prediction[0]]
            grouped[node_type].append({"node_type": node_type, "node_id": node_id, "prediction": prediction})
        results = [result for group in grouped.values() for result in group]
        return envelope(200, uid, data={"results": results})


def handler_for(endpoint: Endpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/ping":
                self._send(200, {"status": "Healthy"})
            elif self.path == "/last":
                with endpoint.lock:
                    self._send(200, endpoint.last)
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            if self.path != "/invocations":
                self._send(404, {"error": "not found"})
                return
            self._send(200, endpoint.invoke(body, self.headers.get("Content-Type")))

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    return Handler


class StandIn:
    """Runs this module as a separate process on 127.0.0.1 (for tests)."""

    def __init__(self, directory: Path, *args: str) -> None:
        self.port_file = directory / "standin.port"
        self.port_file.unlink(missing_ok=True)  # from an earlier run in this folder
        self.log = open(directory / "standin.log", "ab")  # a restart in the same folder appends
        self.proc = subprocess.Popen([sys.executable, __file__, "--port-file", str(self.port_file), *args],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the GraphStorm stand-in did not start")
            time.sleep(0.05)
        self.port = int(self.port_file.read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--require", action="append", default=[], help="TYPE:FEATURE the model needs")
    parser.add_argument("--classes", type=int, default=2)
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    args = parser.parse_args()
    required: dict[str, list[str]] = {}
    for item in args.require:
        node_type, _, feature = item.partition(":")
        required.setdefault(node_type, []).append(feature)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler_for(Endpoint(required, args.classes)))
    tmp = args.port_file.with_suffix(".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.replace(args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
