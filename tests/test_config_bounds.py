"""A config document is bounded while it is read: aliases that expand past
the node bound (a "billion laughs" file), nesting past the depth bound, an
alias inside its own anchor and a file past the size bound are refused with
a clear message, by `gateway check`, `gateway routes` and `gateway serve`
and by every reload path of a running gateway (file watch, POST /reload,
SIGHUP), which keeps serving its old configuration meanwhile; health
probes on the REST listener and the gateway's RSS are watched throughout,
and a file within the bounds is read off the event loop.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.app.configure import load_config
from gateway.config.node import ConfigError
from gateway.config.reader import MAX_BYTES, MAX_DEPTH, MAX_NODES
from peers.echo_gateway import admin_call
from peers.stall_attack import rss_bytes
from support import BUILTIN_REST_CONFIG, REPO, GatewayProcess, wait_for, write_config

# 310 bytes standing for 10**7 strings: each level lists the one above ten times.
BOMB = 'x-a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"x-{b}: &{b} [{','.join([f'*{a}'] * 10)}]\n" for a, b in zip("abcdef", "bcdefg", strict=True))
EXPANDS = f"refused: the document expands to more than {MAX_NODES} nodes"

CONFIG = BUILTIN_REST_CONFIG + "reload: {watch_interval: 100ms}\ndrain: {delay: 0s, timeout: 1s}\n"
INFER = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}).encode()
PROBE_BOUND = 1.0  # seconds, the slowest health probe during the attack
RSS_BOUND = 64 << 20  # growth of the gateway's resident memory


def _problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value.problems


def test_the_bomb_is_small_and_refused_at_its_first_excess(tmp_path: Path) -> None:
    assert len(BOMB) < 400 and BOMB.count("*") == 60
    problems = _problems(write_config(tmp_path, BOMB))
    assert len(problems) == 1 and EXPANDS in problems[0], problems
    assert problems[0].startswith("line 5, column ")  # where the count went past the bound


def test_a_merge_key_bomb_is_refused(tmp_path: Path) -> None:
    """Aliases under merge keys (``<<``) count as the copies they stand for too."""
    text = "x-a: &a {k0: 0, k1: 1, k2: 2, k3: 3, k4: 4, k5: 5, k6: 6, k7: 7, k8: 8, k9: 9}\n" + "".join(
        f"x-{b}: &{b} {{<<: [{','.join([f'*{a}'] * 10)}]}}\n" for a, b in zip("abcdef", "bcdefg", strict=True))
    problems = _problems(write_config(tmp_path, text))
    assert len(problems) == 1 and EXPANDS in problems[0], problems


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path: Path) -> None:
    problems = _problems(write_config(tmp_path, "routes: &loop\n  - upstream: a\n    x: *loop\n"))
    assert problems == ["line 3, column 8: refused: alias *loop refers to a node that contains it"]


def test_nesting_beyond_the_bound_is_refused(tmp_path: Path) -> None:
    deep = "[" * 10_000 + "]" * 10_000  # unbounded, a RecursionError
    problems = _problems(write_config(tmp_path, f"routes: {deep}\n"))
    assert problems == [f"line 1, column {9 + MAX_DEPTH - 1}: refused: nested deeper than {MAX_DEPTH} levels"]


def test_a_file_beyond_the_size_bound_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text("# padding\n" * (MAX_BYTES // 10 + 1))
    assert _problems(path) == [f"<file>: refused: larger than {MAX_BYTES >> 20} MiB"]


def test_aliases_within_the_bounds_still_work(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, CONFIG.replace(
        "    upstream: local\n", "    upstream: local\n    retry: &retry {attempts: 2}\n"
        "  - match: {model: other}\n    upstream: local\n    retry: *retry\n")))
    assert [route.retry.attempts for route in config.routes] == [2, 2]


@pytest.mark.parametrize("command", ["check", "routes", "serve"])
def test_the_cli_refuses_the_bomb(tmp_path: Path, command: str) -> None:
    path = write_config(tmp_path, BOMB)
    result = subprocess.run([sys.executable, "-m", "gateway", command, "--config", str(path)], cwd=REPO,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1, result.stderr
    assert f"{path}: line 5, column " in result.stderr and EXPANDS in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


# --- a running gateway: every reload path, under watch -----------------------------------------


def _infer_status(gw: GatewayProcess) -> int:
    request = urllib.request.Request(f"http://{gw.url()}/v2/models/identity/infer", data=INFER,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        return int(reply.status)


def _failures(gw: GatewayProcess) -> int:
    """Refused reloads so far; 0 while the admin listener does not answer
    (a short wait: the caller samples memory between tries)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{gw.ports['admin']}/reload", timeout=1) as reply:
            return int(json.loads(reply.read())["failures_total"])
    except OSError:
        return 0


class Watch:
    """Health probes on the REST listener (not the admin one the reloads
    use) and the gateway's RSS, sampled until a condition holds; a gateway
    growing past the RSS bound is killed, so a failing run stays small."""

    def __init__(self, gw: GatewayProcess) -> None:
        assert gw.proc is not None
        self.gw, self.pid = gw, gw.proc.pid
        self.baseline = rss_bytes(self.pid)
        self.peak = self.baseline
        self.probes: list[float] = []
        self.failures = 0

    def until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}: {self}"
            self.peak = max(self.peak, rss_bytes(self.pid))
            if self.peak - self.baseline > RSS_BOUND:
                self.gw.proc.kill()  # type: ignore[union-attr]
                pytest.fail(f"RSS grew past the bound while waiting for {what}: {self}")
            started = time.monotonic()
            try:
                with urllib.request.urlopen(f"http://{self.gw.url()}/v2/health/ready", timeout=PROBE_BOUND) as r:
                    assert r.status == 200
            except OSError:
                self.failures += 1
            self.probes.append(time.monotonic() - started)
            time.sleep(0.02)

    def __repr__(self) -> str:
        return (f"{len(self.probes)} probes, {self.failures} failed, slowest {max(self.probes, default=0):.3f}s; "
                f"RSS {self.baseline >> 20} -> peak {self.peak >> 20} MiB")


def test_a_running_gateway_refuses_the_bomb_on_every_reload_path(tmp_path: Path) -> None:
    path = write_config(tmp_path, CONFIG)
    gw = GatewayProcess(path, tmp_path / "gateway.log").start()
    try:
        assert gw.proc is not None
        assert _infer_status(gw) == 200
        watch = Watch(gw)

        # The file watch (a ConfigMap update replaces the file).
        bomb = tmp_path / "bomb.yaml"
        bomb.write_text(BOMB)
        bomb.replace(path)
        watch.until(lambda: _failures(gw) >= 1, 10, "the file watch to refuse the new file")

        # POST /reload, answered while the probes go on.
        answer: list[tuple[int, Any]] = []
        thread = threading.Thread(target=lambda: answer.append(admin_call(gw, "/reload", "POST")), daemon=True)
        thread.start()
        watch.until(lambda: bool(answer), 10, "POST /reload to answer")
        status, body = answer[0]
        assert status == 400 and not body["reloaded"], body
        assert len(body["problems"]) == 1 and EXPANDS in body["problems"][0], body

        # SIGHUP.
        gw.proc.send_signal(signal.SIGHUP)
        watch.until(lambda: _failures(gw) >= 3, 10, "SIGHUP's reload to be refused")

        state = admin_call(gw, "/reload")[1]
        assert state["successes_total"] == 0 and EXPANDS in state["last_error"], state
        assert _infer_status(gw) == 200  # the old configuration keeps serving
        assert watch.failures == 0 and max(watch.probes) < PROBE_BOUND, watch
        assert watch.peak - watch.baseline < RSS_BOUND, watch

        gw.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: gw.proc.poll() is not None, 10, "SIGTERM to stop the gateway")  # type: ignore[union-attr]
        assert gw.proc.returncode == 0, gw.log()
    finally:
        gw.stop()


def test_reading_a_file_at_the_bounds_leaves_the_loop_free(tmp_path: Path) -> None:
    """Just under the node bound, YAML takes seconds of pure Python to read:
    a reload reads it off the event loop, so probes go on meanwhile."""
    path = write_config(tmp_path, CONFIG)
    gw = GatewayProcess(path, tmp_path / "gateway.log").start()
    try:
        watch = Watch(gw)
        big = tmp_path / "big.yaml"  # refused at the end (an unknown key), after the whole read
        big.write_text(CONFIG + "x-padding:\n" + "  - 1\n" * (MAX_NODES - 100))
        big.replace(path)
        watch.until(lambda: _failures(gw) >= 1, 120, "the reload of the big file to be refused")
        assert "x-padding: unknown key" in admin_call(gw, "/reload")[1]["last_error"]
        assert watch.failures == 0 and max(watch.probes) < PROBE_BOUND, watch
        assert _infer_status(gw) == 200
    finally:
        gw.stop()
