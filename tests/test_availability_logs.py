"""Logs never block serving: a stuck access-log or stderr sink
costs dropped, counted lines; SIGUSR1 reopens the access-log file
(logrotate); the event loop's lag is measured on /metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gateway.observability import logwriter
from gateway.observability.logwriter import LineWriter, StderrHandler
from gateway.observability.looplag import LoopLagMonitor
from support import (
    BUILTIN_REST_CONFIG,
    JSON_ACCESS_LOG_CONFIG,
    REPO,
    GatewayProcess,
    metric_value,
    scrape_metrics,
    wait_for,
    write_config,
)

# Each request's line is ~350 bytes: 2,000 of them overflow the pipe (64 KiB)
# plus the writer's queue (512 KiB) several times over.
REQUESTS = 2000


def stuck_pipe() -> tuple[int, int]:
    """A full pipe whose read end nobody reads: the next write blocks."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        while True:
            os.write(write_end, b"." * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(write_end, True)
    return read_end, write_end


# --- a stuck stdout: the gateway as a process ------------------------------------------


def test_access_log_on_a_stuck_stdout_never_blocks_serving(tmp_path: Path) -> None:
    # The default access log (plain, stdout) and the gateway's stderr both go
    # to a pipe nobody reads; before the fix the gateway froze, health
    # included, after ~177 requests.
    config = write_config(tmp_path, BUILTIN_REST_CONFIG)
    port_file = tmp_path / "ports.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--log-level", "info", "serve", "--config", str(config),
         "--port-file", str(port_file)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: port_file.exists() or proc.poll() is not None, 30, "the gateway to bind its listeners")
        assert proc.poll() is None, "the gateway did not start"
        ports = json.loads(port_file.read_text())
        health = f"http://127.0.0.1:{ports['rest']}/v2/health/live"
        latencies = []
        with requests.Session() as session:
            for i in range(REQUESTS):
                started = time.monotonic()
                try:
                    reply = session.get(health, timeout=5)
                except requests.RequestException as exc:
                    pytest.fail(f"request {i} got no answer: the gateway is blocked on its log ({exc})")
                latencies.append(time.monotonic() - started)
                assert reply.status_code == 200
        assert statistics.median(latencies) <= 0.05, f"median {statistics.median(latencies):.3f}s"
        assert max(latencies) <= 1.0, f"max {max(latencies):.3f}s"

        gw = GatewayProcess(config, tmp_path / "unused.log")
        gw.ports = ports
        samples = scrape_metrics(gw)
        dropped = metric_value(samples, "gateway_access_log_dropped_total")
        assert 0 < dropped < REQUESTS, dropped
        assert metric_value(samples, "gateway_requests_total", operation="live") == REQUESTS

        # Stopping waits a bounded time for the stuck sink, then exits.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        assert proc.stdout is not None
        proc.stdout.close()


# --- SIGUSR1 reopens the access-log file; loop lag on /metrics ---------------------------


class FileLogGateway:
    def __init__(self, process: GatewayProcess, access_log: Path, workers: int) -> None:
        self.process = process
        self.access_log = access_log
        self.workers = workers
        self.started = time.monotonic()
        self.sent = 0

    def request(self, request_id: str) -> None:
        # a new connection each time, so with workers the kernel spreads them
        reply = requests.get(f"http://{self.process.url('rest')}/v2/health/live", timeout=5,
                             headers={"x-request-id": request_id, "Connection": "close"})
        assert reply.status_code == 200
        self.sent += 1

    def lines(self, path: Path | None = None) -> list[dict[str, object]]:
        path = path or self.access_log
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module", params=[1, 2], ids=["single", "workers"])
def file_gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FileLogGateway]:
    directory = tmp_path_factory.mktemp("logs")
    access_log = directory / "access.jsonl"
    config = write_config(directory, BUILTIN_REST_CONFIG + JSON_ACCESS_LOG_CONFIG.format(log=access_log))
    extra = ["--workers", str(request.param)] if request.param > 1 else []
    process = GatewayProcess(config, directory / "gateway.log", extra_args=extra)
    with process:
        yield FileLogGateway(process, access_log, request.param)
        assert process.stop() == 0
    log = process.log()
    assert "Traceback" not in log and "Task was destroyed" not in log, log


def test_sigusr1_reopens_the_access_log_file(file_gateway: FileLogGateway) -> None:
    gw = file_gateway
    rotated = gw.access_log.with_name("access.jsonl.1")
    for i in range(4):
        gw.request(f"before-{i}")
    wait_for(lambda: len(gw.lines()) == 4, 5, "the first lines")
    gw.access_log.rename(rotated)  # what logrotate does without copytruncate
    assert gw.process.proc is not None
    gw.process.proc.send_signal(signal.SIGUSR1)

    def every_worker_reopened() -> bool:
        gw.request(f"after-{gw.sent}")
        return {line.get("worker") for line in gw.lines()} >= ({0, 1} if gw.workers > 1 else {None})

    wait_for(every_worker_reopened, 15, "lines of every worker in a new file at the path", interval=0.02)
    assert gw.process.proc.poll() is None
    old, new = gw.lines(rotated), gw.lines()
    assert {line["request_id"] for line in old} >= {f"before-{i}" for i in range(4)}
    assert all(str(line["request_id"]).startswith("after-") for line in new)
    # every request is in one file or the other: none lost to the rotation
    wait_for(lambda: len(gw.lines(rotated)) + len(gw.lines()) == gw.sent, 5, "every line written")
    wait_for(lambda: gw.process.log().count("writer: reopened") == gw.workers, 5, "every reopen logged")


def test_event_loop_lag_histogram_on_metrics(file_gateway: FileLogGateway) -> None:
    time.sleep(max(0.0, 1.0 - (time.monotonic() - file_gateway.started)))
    samples = scrape_metrics(file_gateway.process)
    assert metric_value(samples, "gateway_event_loop_lag_seconds_count") > 0
    buckets = {labels["le"] for name, labels, _ in samples if name == "gateway_event_loop_lag_seconds_bucket"}
    assert {"0.001", "0.05", "1.0", "10.0", "+Inf"} <= buckets
    assert metric_value(samples, "gateway_access_log_dropped_total") == 0


# --- the pieces --------------------------------------------------------------------------


def test_line_writer_drops_and_counts_when_the_sink_is_stuck() -> None:
    read_end, write_end = stuck_pipe()
    drops: list[int] = []
    writer = LineWriter(write_end, max_bytes=64 * 1024, on_drop=drops.append, name="test writer")
    try:
        line = b"x" * 199 + b"\n"
        # The queue takes ~250 of these lines, the pipe none: put() drops the rest, never waits.
        results = [writer.put(line) for _ in range(5000)]
        assert 0 < results.count(True) < 300
        assert sum(drops) == results.count(False) == writer.dropped
        started = time.monotonic()
        assert writer.close(0.2) is False  # the sink never takes the rest: closing gives up
        assert time.monotonic() - started < 5
        assert writer.put(line) is False  # closed
    finally:
        os.close(read_end)
        os.close(write_end)


def test_line_writer_writes_whole_lines_at_most_pipe_buf_per_write(monkeypatch: pytest.MonkeyPatch) -> None:
    read_end, write_end = os.pipe()
    writes: list[bytes] = []
    real_write = os.write
    gate = threading.Event()

    def recording_write(fd: int, data: bytes) -> int:
        if fd == write_end:
            writes.append(bytes(data))
            gate.wait(5)  # the sink is slow on the first write: lines pile up meanwhile
        return real_write(fd, data)

    monkeypatch.setattr(logwriter.os, "write", recording_write)
    writer = LineWriter(write_end, max_bytes=1 << 20, name="test writer")
    writer.put(b"first\n")
    wait_for(lambda: writes, 5, "the first write")
    lines = [f"{i:05d} ".encode() + b"y" * (i % 300) + b"\n" for i in range(200)] + [b"z" * 5000 + b"\n"]
    for line in lines:
        writer.put(line)
    gate.set()
    assert writer.close(5)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        assert reader.read() == b"first\n" + b"".join(lines)
    assert len(writes) < len(lines)  # batched
    for data in writes:
        assert data.endswith(b"\n")
        assert len(data) <= 4096 or data.count(b"\n") == 1  # only a long line goes alone


def test_a_lingering_line_writer_batches_and_wakes_when_half_full_or_closed(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    writer = LineWriter(fd, owns_fd=True, max_bytes=64 * 1024, name="test writer", linger=60.0)
    writer.put(b"first\n")  # the idle thread is woken: written at once
    wait_for(lambda: path.read_bytes() == b"first\n", 5, "the first line")
    line = b"l" * 999 + b"\n"  # 1,064 bytes of queue each: 30 fill it to just under half
    for _ in range(30):  # the lingering thread sleeps on: they wait for one batch
        assert writer.put(line)
    time.sleep(0.2)
    assert path.read_bytes() == b"first\n"
    assert writer.put(line)  # past half the queue: woken early
    wait_for(lambda: path.stat().st_size == 6 + 31 * 1000, 5, "the lines past half the queue")
    writer.put(b"last\n")
    started = time.monotonic()
    assert writer.close(5)  # cuts the linger short
    assert time.monotonic() - started < 2
    assert path.read_bytes() == b"first\n" + line * 31 + b"last\n" and writer.dropped == 0


def test_sparse_lines_wait_the_short_linger_not_the_busy_one(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    writer = LineWriter(fd, owns_fd=True, max_bytes=64 * 1024, name="test writer", linger=0.002, busy_linger=60.0)
    try:
        for i in range(5):  # one line at a time: each written at once, not after the busy linger
            writer.put(b"%d\n" % i)
            wait_for(lambda i=i: path.read_bytes().endswith(b"%d\n" % i), 5, f"line {i}")
            time.sleep(0.01)
    finally:
        assert writer.close(5)


def test_line_writer_reopens_its_path(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    writer = LineWriter(fd, path=str(path), owns_fd=True, max_bytes=1 << 20, name="test writer")
    writer.put(b"one\n")
    wait_for(lambda: path.read_bytes() == b"one\n", 5, "the first line")
    path.rename(tmp_path / "access.log.1")
    writer.reopen()
    wait_for(path.exists, 5, "a new file at the path")
    writer.put(b"two\n")
    assert writer.close(5)
    assert (tmp_path / "access.log.1").read_bytes() == b"one\n"
    assert path.read_bytes() == b"two\n"


def test_stderr_log_handler_never_blocks_on_a_stuck_stderr() -> None:
    read_end, write_end = stuck_pipe()
    handler = StderrHandler(write_end)
    handler.FLUSH_TIMEOUT = 0.2
    logger = logging.getLogger("test_availability_logs.stuck")
    logger.propagate = False
    logger.addHandler(handler)
    drops: list[int] = []
    handler.count_drops_with(drops.append)
    try:
        # 4 MiB of records into a full pipe, from a thread we can wait for with a bound
        done = threading.Thread(target=lambda: [logger.error("%s", "m" * 1000) for _ in range(4096)], daemon=True)
        done.start()
        done.join(10)
        assert not done.is_alive(), "logging blocked on the stuck stderr"
        assert sum(drops) == handler.writer.dropped > 0
        handler.flush()  # bounded
        handler.close()
    finally:
        logger.removeHandler(handler)
        os.close(read_end)
        os.close(write_end)


def test_stderr_log_lines_cannot_be_split_by_unicode_line_breaks() -> None:
    """A message quoting text with line breaks other than \\n (which a
    traceback uses) stays one line for a reader splitting on every break."""
    read_end, write_end = os.pipe()
    handler = StderrHandler(write_end)
    logger = logging.getLogger("test_availability_logs.breaks")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        logger.error("model %s", "m\u2028forged\x85line\u2029x\x0by\x0cz\x1c\x1d\x1e")
        handler.flush()
        text = os.read(read_end, 65536).decode()
        assert text.splitlines() == ["model m\\u2028forged\\u0085line\\u2029x\\u000by\\u000cz\\u001c\\u001d\\u001e"]
    finally:
        logger.removeHandler(handler)
        handler.close()
        os.close(read_end)
        os.close(write_end)


async def test_loop_lag_monitor_sees_a_blocked_loop_and_stops() -> None:
    observed: list[float] = []
    monitor = LoopLagMonitor(observed.append, interval=0.05)
    monitor.start()
    await asyncio.sleep(0.01)  # the monitor is asleep now
    time.sleep(0.3)  # hold the loop, as a synchronous step of a request would
    await asyncio.sleep(0.1)
    assert max(observed) >= 0.2
    await monitor.stop()
    count = len(observed)
    await asyncio.sleep(0.15)
    assert len(observed) == count  # stopped: no more samples
