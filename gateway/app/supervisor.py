"""``gateway serve --workers N``: one supervisor process, N workers.

Every worker is a full gateway (``python -m gateway serve --worker-index i``)
that binds each listener and the admin port with SO_REUSEPORT, so the kernel
spreads connections over the workers. The supervisor

- reserves every port first (a bound, never listening SO_REUSEPORT socket),
  so port 0 becomes one concrete port that all workers share and that no
  other program can take while a crashed worker restarts;
- gives the workers one fresh directory for prometheus-client's multiprocess
  files (``PROMETHEUS_MULTIPROC_DIR``), so ``/metrics`` on any worker reports
  the sum over all of them, and removes it on exit;
- restarts a worker that exits unexpectedly, with exponential backoff, while
  the others keep serving;
- forwards SIGTERM/SIGINT (stop, each worker drains), SIGHUP (reload) and
  SIGUSR1 (reopen the access log file) to the workers, and stops them with
  SIGKILL if they outlast the stop timeout.

It imports no metrics code: each restarted worker counts its own restart.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from gateway.config.address import Address
from gateway.config.model import GatewayConfig
from gateway.protocols.triton import SHM_REGISTRY_ENV

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
STARTUP_TIMEOUT = 60.0  # seconds for every worker to bind its listeners
STOP_TIMEOUT = 60.0  # seconds a worker may drain after SIGTERM before SIGKILL
POLL_INTERVAL = 0.05
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 30.0
STABLE_AFTER = 30.0  # a worker up this long resets the backoff


def worker_count(text: str) -> int:
    """``--workers`` value: a positive integer or ``auto`` (usable CPUs)."""
    if text == "auto":
        return max(1, len(os.sched_getaffinity(0)))
    if not text.isdigit() or int(text) < 1:
        raise ValueError("must be a positive integer or 'auto'")
    return int(text)


def worker_config(config: GatewayConfig, ports: dict[str, int]) -> GatewayConfig:
    """``config`` with the concrete ports the supervisor reserved."""
    listeners = tuple(dataclasses.replace(listener, address=Address(listener.address.host, ports[listener.name]))
                      for listener in config.listeners)
    admin = config.admin
    if admin.address is not None:
        admin = dataclasses.replace(admin, address=Address(admin.address.host, ports["admin"]))
    return dataclasses.replace(config, listeners=listeners, admin=admin)


def reserve_port(address: Address) -> socket.socket:
    """A bound SO_REUSEPORT socket holding ``address``'s port for the workers.

    A fixed port is first bound once without SO_REUSEPORT, so a port that
    another program already listens on is an error here rather than silently
    shared with it.
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM,
                                                   flags=socket.AI_PASSIVE)[0]
    if address.port != 0:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(sockaddr)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(sockaddr)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass
class Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    crashes: int = 0  # consecutive unexpected exits
    restart_at: float | None = None
    restarts: int = 0


class Supervisor:
    def __init__(self, config: GatewayConfig, config_path: str | None, workers: int,
                 port_file: Path | None = None, log_level: str = "info") -> None:
        self.config = config
        self.config_path = str(Path(config_path).resolve()) if config_path else None
        self.workers = [Worker(i) for i in range(workers)]
        self.port_file = port_file
        self.log_level = log_level
        self.ports: dict[str, int] = {}
        self._reserved: list[socket.socket] = []
        self._stop_signal: int | None = None
        self._hangups = 0
        self._reopens = 0
        self._run_dir = Path()

    # --- signals ---------------------------------------------------------------

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop_signal = signum

    def _on_hangup(self, signum: int, frame: FrameType | None) -> None:
        self._hangups += 1

    def _on_reopen(self, signum: int, frame: FrameType | None) -> None:
        self._reopens += 1

    def _signal_all(self, signum: int) -> None:
        for worker in self.workers:
            if worker.proc is not None and worker.proc.poll() is None:
                worker.proc.send_signal(signum)

    # --- workers ----------------------------------------------------------------

    def _reserve_ports(self) -> None:
        addresses = {listener.name: listener.address for listener in self.config.listeners}
        if self.config.admin.address is not None:
            addresses["admin"] = self.config.admin.address
        for name, address in addresses.items():
            sock = reserve_port(address)
            self._reserved.append(sock)
            self.ports[name] = sock.getsockname()[1]

    def _worker_port_file(self, worker: Worker) -> Path:
        return self._run_dir / f"worker-{worker.index}.ports.json"

    def _spawn(self, worker: Worker) -> None:
        port_file = self._worker_port_file(worker)
        port_file.unlink(missing_ok=True)
        command = [sys.executable, "-m", "gateway", "--log-level", self.log_level, "serve",
                   "--worker-index", str(worker.index), "--worker-ports", json.dumps(self.ports),
                   "--port-file", str(port_file)]
        if self.config_path:
            command += ["--config", self.config_path]
        if worker.restarts:
            command.append("--worker-restarted")
        env = {**os.environ, MULTIPROC_ENV: str(self._run_dir / "metrics"),
               SHM_REGISTRY_ENV: str(self._run_dir / "shm")}  # shared-memory registrations, one set for all
        # Own process group: a terminal's Ctrl-C reaches the supervisor only,
        # which stops the workers in order.
        worker.proc = subprocess.Popen(command, env=env, process_group=0)
        worker.started = time.monotonic()
        worker.restart_at = None
        log.info("worker %d started (pid %d)", worker.index, worker.proc.pid)

    def _on_exit(self, worker: Worker) -> None:
        """A worker exited while the supervisor was not stopping: restart it."""
        assert worker.proc is not None
        code, pid = worker.proc.returncode, worker.proc.pid
        worker.proc = None
        from prometheus_client.multiprocess import mark_process_dead

        mark_process_dead(pid, str(self._run_dir / "metrics"))  # its live gauges go; its counters stay
        if time.monotonic() - worker.started >= STABLE_AFTER:
            worker.crashes = 0
        worker.crashes += 1
        delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (worker.crashes - 1))
        how = f"signal {-code}" if code < 0 else f"code {code}"
        log.error("worker %d (pid %d) exited with %s; restarting in %.1fs", worker.index, pid, how, delay)
        worker.restart_at = time.monotonic() + delay
        worker.restarts += 1

    def _start_all(self) -> bool:
        for worker in self.workers:
            self._spawn(worker)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline and self._stop_signal is None:
            for worker in self.workers:
                if worker.proc is not None and worker.proc.poll() is not None:
                    log.error("worker %d exited with %s during startup", worker.index, worker.proc.returncode)
                    return False
            if all(self._worker_port_file(w).exists() for w in self.workers):
                return True
            time.sleep(POLL_INTERVAL)
        if self._stop_signal is None:
            log.error("workers did not start within %.0fs", STARTUP_TIMEOUT)
        return False

    def _write_port_file(self) -> None:
        if self.port_file is not None:
            tmp = self.port_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.ports))
            tmp.replace(self.port_file)

    def _supervise(self) -> None:
        hangups = reopens = 0
        while self._stop_signal is None:
            if self._hangups != hangups:
                hangups = self._hangups
                log.info("SIGHUP: forwarding to the workers")
                self._signal_all(signal.SIGHUP)
            if self._reopens != reopens:
                reopens = self._reopens
                log.info("SIGUSR1: forwarding to the workers")
                self._signal_all(signal.SIGUSR1)
            now = time.monotonic()
            for worker in self.workers:
                if worker.proc is not None and worker.proc.poll() is not None:
                    self._on_exit(worker)
                elif worker.proc is None and worker.restart_at is not None and now >= worker.restart_at:
                    self._spawn(worker)
            time.sleep(POLL_INTERVAL)

    def _stop_all(self) -> None:
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for worker in self.workers:
            if worker.proc is None:
                continue
            try:
                worker.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker %d (pid %d) did not stop in time; killing it", worker.index, worker.proc.pid)
                worker.proc.kill()
                worker.proc.wait(5)

    def run(self) -> int:
        previous: dict[int, Any] = {
            sig: signal.signal(sig, self._on_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._on_hangup)
        previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_reopen)
        self._run_dir = Path(tempfile.mkdtemp(prefix="gateway-run-"))
        (self._run_dir / "metrics").mkdir()
        try:
            try:
                self._reserve_ports()
            except OSError as exc:
                log.error("cannot reserve the listener ports: %s", exc)
                return 1
            if not self._start_all():
                return 0 if self._stop_signal is not None else 1
            self._write_port_file()
            log.info("%d workers serving %s", len(self.workers),
                     ", ".join(f"{name}:{port}" for name, port in self.ports.items()))
            self._supervise()
            log.info("stopping %d workers", len(self.workers))
            return 0
        finally:
            self._stop_all()
            for sock in self._reserved:
                sock.close()
            shutil.rmtree(self._run_dir, ignore_errors=True)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
