"""`gateway serve --workers N`: shared ports, aggregated metrics, restarts, signals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from support import (
    BUILTIN_REST_CONFIG,
    JSON_ACCESS_LOG_CONFIG,
    REPO,
    SIMPLE_INFER_REQUEST,
    GatewayProcess,
    wait_for,
    write_config,
)


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return sorted(found)


def alive(pid: int) -> bool:
    try:
        return not (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z")
    except OSError:
        return False


class Workers:
    def __init__(self, process: GatewayProcess, access_log: Path) -> None:
        self.process = process
        self.access_log = access_log
        assert process.proc is not None
        self.pid = process.proc.pid

    def infer(self, count: int) -> None:
        for _ in range(count):  # a new connection each time, so the kernel spreads them
            reply = requests.post(f"http://{self.process.url('rest')}/v2/models/simple/infer",
                                  json=SIMPLE_INFER_REQUEST, timeout=5, headers={"Connection": "close"})
            assert reply.status_code == 200

    def metric(self, name: str, **labels: str) -> float:
        reply = requests.get(f"http://{self.process.url('admin')}/metrics", timeout=5,
                             headers={"Connection": "close"})
        wanted = set(labels.items())
        return sum(s.value for f in text_string_to_metric_families(reply.text) for s in f.samples
                   if s.name == name and wanted <= set(s.labels.items()))

    def served_by(self) -> Counter[int]:
        lines = [json.loads(line) for line in self.access_log.read_text().splitlines()]
        return Counter(line["worker"] for line in lines if line["operation"] == "infer")

    def infers_counted(self) -> float:
        return self.metric("gateway_requests_total", operation="infer", outcome="ok")


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    access_log = tmp_path / "access.jsonl"
    config = write_config(tmp_path, BUILTIN_REST_CONFIG + JSON_ACCESS_LOG_CONFIG.format(log=access_log))
    process = GatewayProcess(config, tmp_path / "gateway.log", extra_args=["--workers", "2"])
    with process:
        wait_for(lambda: len(children(process.proc.pid)) == 2, 10, "two workers")  # type: ignore[union-attr]
        yield Workers(process, access_log)


def test_metrics_aggregate_equals_true_total(workers: Workers) -> None:
    workers.infer(60)
    served = wait_for(lambda: (s := workers.served_by()) and sum(s.values()) == 60 and s, 5, "60 log lines")
    assert set(served) == {0, 1}, f"the kernel gave every connection to one worker: {served}"
    # whichever worker answers the scrape reports the sum over both
    for _ in range(6):
        assert wait_for(lambda: workers.infers_counted() == 60, 5, "the aggregate count")
    assert workers.metric("gateway_request_duration_seconds_count", operation="infer") == 60
    assert workers.metric("gateway_worker_processes") == 2
    assert workers.metric("gateway_requests_in_flight") == 0


def test_crashed_worker_is_restarted_and_its_counts_survive(workers: Workers) -> None:
    workers.infer(20)
    victim, survivor = children(workers.pid)
    command_line = Path(f"/proc/{victim}/cmdline").read_bytes().split(b"\0")
    index = int(command_line[command_line.index(b"--worker-index") + 1])
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(kids := children(workers.pid)) == 2 and victim not in kids, 15, "a replacement worker")
    replacement = next(p for p in children(workers.pid) if p != survivor)
    wait_for(lambda: f"worker {index} started (pid {replacement})" in workers.process.log(), 5, "the restart")
    before = wait_for(lambda: (s := workers.served_by()) and sum(s.values()) == 20 and s, 15, "20 log lines")
    wait_for(lambda: workers.metric("gateway_worker_processes") == 2, 15, "the replacement to serve")
    workers.infer(40)
    assert wait_for(lambda: workers.infers_counted() == 60, 5, "60 counted, the dead worker's included")
    # (the access log is written by its own thread: wait for the last lines)
    assert wait_for(lambda: workers.served_by()[index] > before[index], 5, "the replacement's requests"), \
        "the replacement took no requests"
    assert workers.metric("gateway_worker_restarts_total") == 1
    assert workers.metric("gateway_worker_processes") == 2  # the dead one's live gauge is gone
    assert alive(survivor) and alive(replacement)
    wait_for(lambda: "exited with signal 9; restarting" in workers.process.log(), 5, "the restart logged")


def run_dir_of(worker: int) -> Path:
    """The supervisor's per-run directory, read from a worker's command line."""
    command_line = Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")
    return Path(command_line[command_line.index(b"--port-file") + 1].decode()).parent


def test_signals_are_forwarded_and_stop_cleans_up(workers: Workers) -> None:
    pids = children(workers.pid)
    run_dir = run_dir_of(pids[0])
    assert (run_dir / "metrics").is_dir()
    os.kill(workers.pid, signal.SIGHUP)
    wait_for(lambda: workers.process.log().count("configuration reloaded") == 2, 10, "both workers to reload")
    assert children(workers.pid) == pids  # a reload signal restarts nothing
    workers.infer(2)
    assert workers.process.stop() == 0
    assert not any(alive(p) for p in pids)
    assert not run_dir.exists()


def test_workers_stop_when_the_supervisor_is_killed(workers: Workers) -> None:
    pids = children(workers.pid)
    run_dir = run_dir_of(pids[0])
    os.kill(workers.pid, signal.SIGKILL)
    wait_for(lambda: not any(alive(p) for p in pids), 10, "orphaned workers to stop")
    shutil.rmtree(run_dir)  # nobody else is left to remove it


def test_port_taken_by_another_program_is_an_error(tmp_path: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        config = write_config(tmp_path, BUILTIN_REST_CONFIG.replace(
            'v2-rest, address: "127.0.0.1:0"', f'v2-rest, address: "127.0.0.1:{port}"'))
        for workers in ("1", "2"):  # neither mode silently shares a port with a stranger
            result = subprocess.run([sys.executable, "-m", "gateway", "serve", "--config", str(config),
                                     "--workers", workers], cwd=REPO, capture_output=True, text=True, timeout=30)
            assert result.returncode == 1, result.stderr
            assert "in use" in result.stderr, result.stderr


def test_workers_argument_is_checked(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "gateway", "serve", "--workers", "many"], cwd=REPO,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "positive integer or 'auto'" in result.stderr
