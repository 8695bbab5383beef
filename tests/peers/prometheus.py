"""A real Prometheus server and promtool (Debian package ``prometheus``,
installed by scripts/ensure-prometheus.sh), run on loopback by the tests."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from support import free_port, stop_process, wait_for


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed; `make test` installs it (scripts/ensure-prometheus.sh)")
    return path


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([binary("promtool"), *args], input=stdin, capture_output=True, timeout=60)


class PrometheusServer:
    """``prometheus`` scraping ``targets`` every ``interval`` on 127.0.0.1."""

    def __init__(self, directory: Path, targets: list[str], metrics_path: str = "/metrics",
                 interval: str = "1s", job: str = "gateway") -> None:
        self.directory = directory
        self.port = free_port()
        self.config = directory / "prometheus.yml"
        self.config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
            "scrape_configs": [{"job_name": job, "metrics_path": metrics_path,
                                "static_configs": [{"targets": targets}]}],
        }))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = directory / "prometheus.log"

    def start(self) -> PrometheusServer:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [binary("prometheus"), f"--config.file={self.config}", f"--storage.tsdb.path={self.directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=self.directory)

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{self.log_path.read_text(errors='replace')}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(ready, 30, "prometheus to be ready", interval=0.2)
        return self

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:  # 400/422 carry the error as JSON
            return json.load(exc)

    def query(self, expr: str) -> Any:
        return self.api("query", query=expr)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
        self._log.close()

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
