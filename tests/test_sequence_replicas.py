"""Sequence affinity across gateway replicas and workers: a sequence's
endpoint is a function of its id and the available endpoints (rendezvous
hashing), so every process sends its requests to the same endpoint without
sharing state.

Two gateway processes serve the builtin sequence models (each keeps its own
sequences' state and refuses a step of a sequence it never saw START).
Between them and the client sit either three front gateways or one front
with ``--workers 2``, behind nginx balancing round robin with a new
connection to the fronts per request (HTTP/1.0, no keep-alive), so the steps
of one sequence land on different processes. The fronts balance by
``least_request``: idle fronts balancing round robin would all pick in
lockstep and hide the fault. Triton's HTTP sequence example client runs
through nginx.

With pins kept per process only (the code before rendezvous hashing, base
commit 4cec4bc: a process that had not seen a sequence balanced its step as
any request), these tests fail. Measured there, 5 runs of each
(``pytest tests/test_sequence_replicas.py -k example`` with that commit's
``gateway/``): three replicas failed 5 of 5, ``--workers 2`` 5 of 5, the
example exiting 1 with "[400] upstream 'stateful' answered 400: inference
request for sequence 1000 to model 'simple_dyna_sequence' must specify the
START flag on the first request of the sequence". The endpoint-leaving test
failed there in 3 of 4 runs (three replicas 2 of 2, ``--workers 2`` 1 of 2)
before any endpoint left ("... for sequence 205 ... must specify the START
flag ..."). With the change: 3 runs of the file, 4 of 4 passed each time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from sequence_steps import run_example_over, start_on_each, step, unhealthy_endpoints
from tritonclient.utils import InferenceServerException

from support import (
    BUILTIN_REST_CONFIG,
    JSON_ACCESS_LOG_CONFIG,
    GatewayProcess,
    free_port,
    port_open,
    stop_process,
    wait_for,
    write_config,
)

# --- through nginx, over real processes -------------------------------------------------------------------

def front_config(backends: list[GatewayProcess], access_log: Path) -> str:
    endpoints = ", ".join(f'"127.0.0.1:{b.ports["rest"]}"' for b in backends)
    health = "health_check: {interval: 100ms, timeout: 1s, unhealthy_threshold: 1, healthy_threshold: 1}"
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: stateful, protocol: v2-rest, endpoints: [{endpoints}], load_balancing: {{policy: least_request}}, {health}}}
routes:
  - {{match: {{model: "*"}}, upstream: stateful}}
""" + JSON_ACCESS_LOG_CONFIG.format(log=access_log)


class Nginx:
    """nginx balancing round robin over ``ports``, one worker, a new
    connection upstream for every request (HTTP/1.0, nginx's default)."""

    def __init__(self, directory: Path, ports: list[int]) -> None:
        directory.mkdir()
        self.port = free_port()
        servers = "\n".join(f"    server 127.0.0.1:{port};" for port in ports)
        conf = directory / "nginx.conf"
        conf.write_text(f"""
worker_processes 1;
error_log {directory}/error.log warn;
pid {directory}/nginx.pid;
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {directory}/body;
  proxy_temp_path {directory}/proxy;
  fastcgi_temp_path {directory}/fastcgi;
  uwsgi_temp_path {directory}/uwsgi;
  scgi_temp_path {directory}/scgi;
  upstream fronts {{
{servers}
  }}
  server {{
    listen 127.0.0.1:{self.port};
    location / {{ proxy_pass http://fronts; proxy_next_upstream off; }}
  }}
}}
""")
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc = subprocess.Popen([binary, "-p", str(directory), "-e", str(directory / "error.log"),
                                      "-c", str(conf), "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: self.proc.poll() is not None or port_open(self.port), 10, "nginx to listen")
        except BaseException:
            self.stop()
            raise
        if self.proc.poll() is not None:
            raise RuntimeError(f"nginx exited with {self.proc.returncode}: {(directory / 'error.log').read_text()}")

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process(self.proc)


class Setup:
    def __init__(self, nginx: Nginx, fronts: list[GatewayProcess], backends: list[GatewayProcess]) -> None:
        self.nginx, self.fronts, self.backends = nginx, fronts, backends


@pytest.fixture(params=["three replicas", "two workers"])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Setup]:
    started: list[GatewayProcess] = []
    nginx = None
    try:
        for name in ("a", "b"):
            directory = tmp_path / name
            directory.mkdir()
            started.append(GatewayProcess(write_config(directory, BUILTIN_REST_CONFIG),
                                          directory / "gateway.log").start())
        backends = started[:2]
        if request.param == "three replicas":
            fronts = []
            for index in range(3):
                directory = tmp_path / f"front{index}"
                directory.mkdir()
                config = write_config(directory, front_config(backends, directory / "access.jsonl"))
                fronts.append(GatewayProcess(config, directory / "gateway.log").start())
        else:
            directory = tmp_path / "front"
            directory.mkdir()
            config = write_config(directory, front_config(backends, directory / "access.jsonl"))
            fronts = [GatewayProcess(config, directory / "gateway.log", extra_args=["--workers", "2"]).start()]
        started += fronts
        ports = [front.ports["rest"] for front in fronts]
        nginx = Nginx(tmp_path / "nginx", ports * 2 if len(ports) == 1 else ports)
        yield Setup(nginx, fronts, backends)
    finally:
        if nginx is not None:
            nginx.stop()
        for process in started:
            process.stop()


def test_triton_sequence_example_passes_through_replicas(setup: Setup) -> None:
    served = run_example_over("simple_http_sequence_sync_infer_client.py", setup.nginx.url, setup.backends, "-d",
                              at_least=5)
    assert all(count > 0 for count in served), served  # both endpoints held sequences
    # nginx spread the steps over every replica, the kernel over both workers
    processes = 2 if len(setup.fronts) == 1 else len(setup.fronts)
    wait_for(lambda: len(_serving_processes(setup)) == processes, 5, f"steps served by {processes} processes")


def _serving_processes(setup: Setup) -> set[tuple[int, int]]:
    """(front, worker) of every process whose access log has a sequence's step."""
    served = set()
    for index, front in enumerate(setup.fronts):
        log = front.config_path.parent / "access.jsonl"
        for line in log.read_text().splitlines() if log.exists() else ():
            entry = json.loads(line)
            if "sequence" in entry.get("model", ""):
                served.add((index, entry.get("worker", 0)))
    return served


def test_an_endpoint_that_leaves_ends_its_sequences_on_every_replica(setup: Setup) -> None:
    """Its sequences end, on a replica holding their pin (the gateway's 503,
    "the sequence has ended") as on one without (the survivor, never having
    seen their START, refuses); none moves to the survivor with a wrong sum,
    and the survivor's go on whole."""
    with httpclient.InferenceServerClient(setup.nginx.url) as client:
        held = start_on_each(client, setup.backends, 3, 201)
        for sequence_id in held[0] + held[1]:
            assert step(client, sequence_id, 1) == 2
        setup.backends[1].stop()
        wait_for(lambda: all(unhealthy_endpoints(front, "stateful") == 1 for front in setup.fronts), 10,
                 "every front to mark the stopped endpoint unhealthy")
        for round_ in range(2):  # each sequence's steps meet several processes
            for sequence_id in held[0]:
                assert step(client, sequence_id, 1) == 3 + round_
            for sequence_id in held[1]:
                with pytest.raises(InferenceServerException) as caught:
                    step(client, sequence_id, 1)
                # (a worker yet to see the endpoint fail finds it refusing connections: 503 too)
                message = caught.value.message()
                assert caught.value.status() == "503" or "START flag" in message, message
                assert "127.0.0.1" not in message
        for sequence_id in held[1]:  # a new START goes to the survivor
            assert step(client, sequence_id, 5, start=True) == 5
