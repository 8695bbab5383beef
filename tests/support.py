"""Helpers for tests that run real processes on loopback.

Every process is started by the test, talked to over 127.0.0.1 only, and
stopped by its process id; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def free_port() -> int:
    """A port for peers that cannot bind port 0 and report it themselves."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


class GatewayProcess:
    """``python -m gateway serve`` in its own process, ports read back from
    the --port-file it writes once every listener is bound."""

    def __init__(self, config_path: Path, log_path: Path, extra_env: dict[str, str] | None = None,
                 extra_args: list[str] | None = None, module: str = "gateway",
                 prefix: list[str] | None = None) -> None:
        self.module = module  # e.g. a test launcher that registers extra protocols
        self.prefix = prefix or []  # e.g. nsenter into a private network namespace (netns.py)
        self.config_path = config_path
        self.log_path = log_path
        self.port_file = config_path.with_suffix(".ports.json")
        self.extra_env = extra_env or {}
        self.extra_args = extra_args or []  # after `serve`, e.g. ["--workers", "2"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}

    def start(self, timeout: float = 30.0) -> GatewayProcess:
        env = {**os.environ, **self.extra_env}
        self.port_file.unlink(missing_ok=True)  # a restart must wait for the new process's file
        self._log = open(self.log_path, "ab" if self.proc is not None else "wb")  # a restart appends
        self.proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", self.module, "--log-level", os.environ.get("GW_TEST_LOG", "info"),
             "serve", "--config", str(self.config_path), "--port-file", str(self.port_file), *self.extra_args],
            cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}:\n{self.log()}")
            return self.port_file.exists()

        try:
            wait_for(ready, timeout, "the gateway to bind its listeners")
        except BaseException:
            self.stop()  # no process or open log left behind by a failed start
            raise
        self.ports = json.loads(self.port_file.read_text())
        return self

    def url(self, listener: str = "rest") -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        code = stop_process(self.proc) if self.proc else 0
        self._log.close()
        return code

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()



class Clock:
    """A monotonic clock a test moves by hand (``clock.now = ...``)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

def write_config(directory: Path, text: str, name: str = "gateway.yaml") -> Path:
    path = directory / name
    path.write_text(text)
    return path


BUILTIN_REST_CONFIG = """
admin: {address: "127.0.0.1:0"}
listeners:
  - {name: rest, protocol: v2-rest, address: "127.0.0.1:0"}
upstreams:
  - {name: local, protocol: builtin}
routes:
  - match: {model: "*"}
    upstream: local
"""


def parse_yaml_config(text: str) -> Any:
    import yaml

    from gateway.app.configure import parse_config

    return parse_config(yaml.safe_load(text), "<test>")


class InProcessGateway:
    """The gateway on port 0 inside the test's event loop (async tests)."""

    def __init__(self, config_text: str) -> None:
        from gateway.app.server import Gateway

        self.gateway = Gateway(parse_yaml_config(config_text))

    async def __aenter__(self) -> InProcessGateway:
        await self.gateway.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.gateway.stop(0)

    def url(self, listener: str = "rest") -> str:
        return f"http://127.0.0.1:{self.gateway.ports[listener]}"
# `.format(log=path)`: one JSON access-log line per request into that file.
JSON_ACCESS_LOG_CONFIG = """
observability:
  access_log: {{format: json, destination: "{log}"}}
"""

SIMPLE_INFER_REQUEST = {"inputs": [
    {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
    {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]}


def scrape_metrics(gw: GatewayProcess) -> list[tuple[str, dict[str, str], float]]:
    """The gateway's ``/metrics`` (admin listener) as (sample name, labels, value)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{gw.ports['admin']}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def metric_value(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
    return sum(value for sample, have, value in samples
               if sample == name and all(have.get(k) == v for k, v in labels.items()))


def passthrough_counts(gw: GatewayProcess) -> dict[tuple[str, str], float]:
    """``gateway_passthrough_requests_total`` by (upstream, mode), summed over listeners."""
    counts: dict[tuple[str, str], float] = {}
    for name, labels, value in scrape_metrics(gw):
        if name == "gateway_passthrough_requests_total":
            key = (labels["upstream"], labels["mode"])
            counts[key] = counts.get(key, 0.0) + value
    return counts
