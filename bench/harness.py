"""Benchmark plumbing: processes, load generation, measurements, reports.

Everything runs on loopback; every process is started here and stopped by
pid. Load comes from wrk (C, multi-threaded) so the generator is not the
bottleneck; Python clients are used only where a protocol needs them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 60.0, proc: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open within {timeout}s")


class Process:
    """A child process with its output in a log file, stopped by pid."""

    def __init__(self, name: str, args: list[str], log_dir: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})}, cwd=cwd or REPO,
                                     start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_peak_bytes(self) -> int:
        """Peak resident set (VmHWM) of the process and its children."""
        total = 0
        for pid in [self.pid, *_children(self.pid)]:
            try:
                text = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            match = re.search(r"VmHWM:\s+(\d+) kB", text)
            total += int(match.group(1)) * 1024 if match else 0
        return total

    def rss_bytes(self) -> int:
        try:
            text = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return 0
        match = re.search(r"VmRSS:\s+(\d+) kB", text)
        return int(match.group(1)) * 1024 if match else 0

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the process has used so far: on a shared
        machine a steadier measure of its own cost than wall time."""
        return sum(self.cpu_times())

    def tree_cpu_seconds(self) -> float:
        """CPU time (user + system) of the process and all its descendants
        (see :func:`tree_cpu_seconds`)."""
        return tree_cpu_seconds(self.pid)

    def cpu_times(self) -> tuple[float, float]:
        """User and system CPU time the process has used so far (user: the
        interpreter and the C libraries it calls; system: the kernel's
        share, sockets mostly)."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0, 0.0
        tick = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / tick, int(fields[12]) / tick

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    kids = [int(x) for x in text.split()]
    return kids + [g for k in kids for g in _children(k)]


def tree_cpu_seconds(root: int) -> float:
    """CPU time (user + system) so far of ``root`` and every descendant,
    found by walking /proc/*/stat for parent links (children forked by any
    thread, grandchildren): fields 14-15 (utime, stime) of a process already
    sum its threads; 16-17 (cutime, cstime) add the children it has reaped,
    so a child that exits between two readings still counts."""
    stats: dict[int, tuple[int, int]] = {}  # pid -> (ppid, ticks)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited while we looked
            continue
        stats[int(entry.name)] = int(fields[1]), sum(int(x) for x in fields[11:15])
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        kids.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += stats[pid][1] if pid in stats else 0
        todo += kids.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


def nginx_config(prefix: Path, http: str) -> str:
    """An nginx.conf for one worker, no access log, every file under
    ``prefix``; ``http`` holds the upstream and server blocks."""
    return f"""
worker_processes 1;
error_log {prefix}/logs/error.log warn;
pid {prefix}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_max_body_size 0;
  client_body_temp_path {prefix}/body;
  proxy_temp_path {prefix}/proxy;
  fastcgi_temp_path {prefix}/fastcgi;
  uwsgi_temp_path {prefix}/uwsgi;
  scgi_temp_path {prefix}/scgi;
{http}
}}
"""


# --- wrk ------------------------------------------------------------------


@dataclass
class LoadResult:
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    errors: int = 0
    requests: int = 0


_WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("{body}", "rb")
wrk.body = f:read("*all")
f:close()
done = function(summary, latency, requests)
  io.write(string.format("RESULT %f %f %d %d %d\\n",
    latency:percentile(50) / 1000.0, latency:percentile(99) / 1000.0,
    summary.requests, summary.errors.status + summary.errors.connect + summary.errors.read
      + summary.errors.write + summary.errors.timeout, summary.duration))
end
"""


def wrk(url: str, body: bytes, connections: int, seconds: float, threads: int = 1) -> LoadResult:
    """POST ``body`` to ``url`` with wrk; latency in ms and throughput."""
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not installed (apt-get install wrk)")
    with tempfile.TemporaryDirectory() as tmp:
        body_path = Path(tmp) / "body"
        body_path.write_bytes(body)
        script = Path(tmp) / "post.lua"
        script.write_text(_WRK_SCRIPT.replace("{body}", str(body_path)))
        run = subprocess.run(
            ["wrk", f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
             "-s", str(script), url],
            capture_output=True, text=True, timeout=seconds + 60)
        if run.returncode != 0:
            raise RuntimeError(f"wrk failed ({run.returncode}): {run.stderr.strip()[:300]}")
        out = run.stdout
    match = re.search(r"RESULT (\S+) (\S+) (\d+) (\d+) (\d+)", out)
    if not match:
        raise RuntimeError(f"wrk printed no result:\n{out}")
    p50, p99, requests, errors, duration_us = match.groups()
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    total_errors = int(errors) + (int(non2xx.group(1)) if non2xx else 0)
    return LoadResult(int(requests) / (int(duration_us) / 1e6), float(p50), float(p99), total_errors,
                      int(requests))


def timed(call: Callable[[], Any], repeat: int, warmup: int = 2) -> list[float]:
    """Wall times in seconds of ``repeat`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def interleaved(calls: dict[str, Callable[[], Any]], repeat: int, warmup: int = 2) -> dict[str, list[float]]:
    """Wall times in seconds per variant, the variants taking turns call by
    call (in rotating order), so that load from elsewhere hits them alike."""
    names = list(calls)
    for _ in range(warmup):
        for name in names:
            calls[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeat):
        for name in names[i % len(names):] + names[:i % len(names)]:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return times


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


# --- report ---------------------------------------------------------------


@dataclass
class Row:
    scenario: str
    measure: str
    values: dict[str, float]  # variant -> value
    ratio: float | None = None  # the number a target is stated on
    target: str = ""
    met: bool | None = None
    note: str = ""
    unit: str = ""


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)  # markdown tables shown after the rows

    def add_table(self, title: str, header: list[str], rows: list[list[str]]) -> None:
        """A table of its own (one line per variant), printed and kept for
        :meth:`markdown`."""
        lines = [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        text = "\n".join(lines)
        self.tables.append(text)
        print(text, flush=True)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        shown = ", ".join(f"{k}={v:.3g}{row.unit}" for k, v in row.values.items())
        verdict = "" if row.met is None else (" MET" if row.met else " MISSED")
        ratio = f" ratio={row.ratio:.2f}" if row.ratio is not None else ""
        print(f"[{row.scenario}] {row.measure}: {shown}{ratio} {row.target}{verdict} {row.note}", flush=True)

    def markdown(self, header: str) -> str:
        lines = [header, "", "| scenario | measure | values | ratio | target | verdict |",
                 "|---|---|---|---|---|---|"]
        for r in self.rows:
            values = "<br>".join(f"{k}: {v:.3g} {r.unit}".strip() for k, v in r.values.items())
            ratio = f"{r.ratio:.2f}" if r.ratio is not None else ""
            verdict = "" if r.met is None else ("met" if r.met else "**missed**")
            note = f" ({r.note})" if r.note else ""
            lines.append(f"| {r.scenario} | {r.measure}{note} | {values} | {ratio} | {r.target} | {verdict} |")
        for table in self.tables:
            lines += ["", table]
        return "\n".join(lines) + "\n"

    def plot(self, path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [r for r in self.rows if r.values]
        if not rows:
            return
        fig, axes = plt.subplots(len(rows), 1, figsize=(8, 1.6 * len(rows) + 0.5), squeeze=False)
        for ax, row in zip(axes[:, 0], rows, strict=True):
            names = list(row.values)
            ax.barh(names, [row.values[n] for n in names], color="#4c72b0")
            ax.set_title(f"{row.scenario}: {row.measure} ({row.unit})", fontsize=9, loc="left")
            ax.tick_params(labelsize=8)
            ax.invert_yaxis()
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
