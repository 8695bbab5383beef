"""Hot reload and graceful drain of a gateway process under load."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from peers.echo_gateway import admin_call, echo_gateway, rest_base
from peers.echo_upstream import EchoServer
from peers.load import PAYLOAD, assert_all_answered, infer, run_load
from support import GatewayProcess, metric_value, scrape_metrics, wait_for


def config(a: EchoServer, b: EchoServer, route: str, extra: str = "") -> str:
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams:
  - {{name: a, protocol: echo, endpoints: ["{a.address}"]}}
  - {{name: b, protocol: echo, endpoints: ["{b.address}"]}}
routes:
{route}
{extra}
"""


def routed_to(gw: GatewayProcess) -> str:
    """The upstream of the first route, as the admin endpoint shows it."""
    return str(admin_call(gw, "/routes")[1]["routes"][0].split(" -> ")[1].split()[0])


TO_A = "  - {name: main, match: {model: '*'}, upstream: a}"
TO_B = "  - {name: main, match: {model: '*'}, upstream: b}"
BAD_SPLIT = "  - {match: {model: '*'}, split: [{upstream: a, weight: 60}, {upstream: b, weight: 30}]}"


async def test_reload_under_load_switches_atomically_and_rejects_bad_files(tmp_path: Path) -> None:
    a, b = EchoServer("A", tmp_path), EchoServer("B", tmp_path)
    EchoServer.start_all([a, b])
    try:
        with echo_gateway(tmp_path, config(a, b, TO_A)) as gw:
            path = gw.config_path
            stop = asyncio.Event()
            load = asyncio.ensure_future(run_load(rest_base(gw), "m", duration=60, concurrency=6, stop=stop))
            await asyncio.sleep(0.5)

            path.write_text(config(a, b, TO_B))
            assert gw.proc is not None
            gw.proc.send_signal(signal.SIGHUP)
            await asyncio.to_thread(wait_for, lambda: routed_to(gw) == "b", 5, "SIGHUP to apply the new routes")
            switched_at = time.monotonic()
            await asyncio.sleep(0.5)

            path.write_text(config(a, b, BAD_SPLIT, "bogus_section: 1"))
            status, body = await asyncio.to_thread(admin_call, gw, "/reload", "POST")
            assert status == 400 and not body["reloaded"]
            assert "routes[0].split: weights must add up to 100, got 90" in body["problems"]
            assert "bogus_section: unknown key" in body["problems"]
            path.write_text(config(a, b, TO_B).replace("address: \"127.0.0.1:0\"}]", "address: \"127.0.0.1:1\"}]"))
            status, body = await asyncio.to_thread(admin_call, gw, "/reload", "POST")
            assert status == 400 and body["problems"][0].startswith("listeners: changed, which needs a restart")
            await asyncio.sleep(0.3)
            assert routed_to(gw) == "b"  # the old config keeps serving
            after_failures = scrape_metrics(gw)

            path.write_text(config(a, b, TO_A))
            last_post_at = time.monotonic()
            status, body = await asyncio.to_thread(admin_call, gw, "/reload", "POST")
            assert status == 200 and body["reloaded"]
            back_at = time.monotonic()
            await asyncio.sleep(0.5)
            stop.set()
            results = await load
            _, reloads = admin_call(gw, "/reload")
            at_end = scrape_metrics(gw)
            # (the log is written by its own thread: the last lines may lag the answers)
            expected = ("reload rejected, the running configuration keeps serving",
                        "routes[0].split: weights must add up to 100, got 90")
            log = wait_for(lambda: all(line in (text := gw.log()) for line in expected) and text, 5,
                           "the rejected reloads logged")
    finally:
        a.stop()
        b.stop()
    assert_all_answered(results, at_least=200)
    # Started after the switch was visible, or done before the next reload was asked for: B.
    assert all(r.server == "B" for r in results if switched_at < r.started and r.started + r.elapsed < last_post_at)
    assert all(r.server == "A" for r in results if r.started > back_at)
    assert reloads["successes_total"] == 2 and reloads["failures_total"] == 2
    assert reloads["last_success_time"] > reloads["last_failure_time"] > 0
    assert "reload rejected, the running configuration keeps serving" in log
    # The same on /metrics (issue 7).
    assert metric_value(after_failures, "gateway_config_reloads_total", result="success") == 1
    assert metric_value(after_failures, "gateway_config_reloads_total", result="failure") == 2
    assert metric_value(after_failures, "gateway_config_last_reload_successful") == 0
    assert metric_value(at_end, "gateway_config_reloads_total", result="success") == 2
    assert metric_value(at_end, "gateway_config_reloads_total", result="failure") == 2
    assert metric_value(at_end, "gateway_config_last_reload_successful") == 1
    assert metric_value(at_end, "gateway_config_last_reload_success_timestamp_seconds") \
        == pytest.approx(reloads["last_success_time"], abs=1.0)
    assert "routes[0].split: weights must add up to 100, got 90" in log


async def test_reload_on_file_change(tmp_path: Path) -> None:
    a, b = EchoServer("A", tmp_path), EchoServer("B", tmp_path)
    EchoServer.start_all([a, b])
    watch = "reload: {watch_interval: 200ms}"
    try:
        with echo_gateway(tmp_path, config(a, b, TO_A, watch)) as gw:
            async with aiohttp.ClientSession() as session:
                assert (await infer(session, rest_base(gw), "m")).server == "A"
                gw.config_path.write_text(config(a, b, TO_B, watch) + "\n# changed\n")

                async def server() -> str:
                    return (await infer(session, rest_base(gw), "m")).server

                deadline = time.monotonic() + 5
                while await server() != "B":
                    assert time.monotonic() < deadline, "the file change was not picked up"
                    await asyncio.sleep(0.1)
    finally:
        a.stop()
        b.stop()


async def test_sigterm_under_load_answers_everything_accepted(tmp_path: Path) -> None:
    a, b = EchoServer("A", tmp_path, delay=0.1), EchoServer("B", tmp_path)
    EchoServer.start_all([a, b])
    delay = 2.0  # long enough that a loaded machine still sees readiness drop well inside it
    gw = echo_gateway(tmp_path, config(a, b, TO_A, f"drain: {{delay: {delay}s, timeout: 5s}}"))
    try:
        gw.start()
        stop = asyncio.Event()
        load = asyncio.ensure_future(run_load(rest_base(gw), "m", duration=60, concurrency=8, stop=stop))
        await asyncio.sleep(1.0)
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        # Readiness drops as soon as the signal is handled, long before the listeners close.
        await asyncio.to_thread(wait_for, lambda: admin_call(gw, "/readyz") == (503, {"ready": False}), 1.0,
                                "readiness to turn false")
        code = await asyncio.to_thread(gw.proc.wait, 15)
        exited = time.monotonic()
        await asyncio.sleep(0.5)  # keep knocking on the closed port for a while
        stop.set()
        results = await load
    finally:
        gw.stop()
        a.stop()
        b.stop()
    assert code == 0
    assert delay < exited - signalled < delay + 3
    accepted = [r for r in results if r.started < signalled + delay - 0.3]
    assert accepted and all(r.ok for r in accepted), [r for r in accepted if not r.ok][:5]
    assert sum(1 for r in accepted if r.started > signalled) > 20  # new work kept coming in during the delay
    # After the listener closed, clients are refused: no half answers, no 5xx.
    assert all(r.status in (200, 0) for r in results)
    assert any(r.status == 0 for r in results if r.started > exited)


async def test_drain_timeout_bounds_in_flight_requests(tmp_path: Path) -> None:
    a, b = EchoServer("A", tmp_path), EchoServer("B", tmp_path)
    EchoServer.start_all([a, b])
    gw = echo_gateway(tmp_path, config(a, b, TO_A, "drain: {delay: 0s, timeout: 1s}"))
    try:
        gw.start()
        async with aiohttp.ClientSession() as session:
            def slow(ms: int) -> dict[str, Any]:
                return {**PAYLOAD, "parameters": {"delay_ms": ms}}

            short = asyncio.ensure_future(infer(session, rest_base(gw), "m", payload=slow(400)))
            long = asyncio.ensure_future(infer(session, rest_base(gw), "m", payload=slow(8000)))
            await asyncio.sleep(0.2)
            assert gw.proc is not None
            gw.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            code = await asyncio.to_thread(gw.proc.wait, 15)
            stopped_after = time.monotonic() - signalled
            finished, cut = await short, await long
    finally:
        gw.stop()
        a.stop()
        b.stop()
    assert code == 0 and stopped_after < 3
    assert finished.ok  # finished within the drain timeout
    assert cut.status == 0 and cut.elapsed < 4  # cut off at the drain timeout, not left hanging


def test_a_configmap_symlink_swap_is_picked_up(tmp_path: Path) -> None:
    """A Kubernetes ConfigMap volume: `gateway.yaml` -> `..data/gateway.yaml`,
    `..data` -> a timestamped directory; an update writes a new directory and
    swaps `..data`. The new file has the same size and time here, so only
    the swap itself tells: the watcher must follow it."""
    def version(route_name: str) -> str:
        return f"""
admin: {{address: "127.0.0.1:0"}}
reload: {{watch_interval: 100ms}}
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams: [{{name: local, protocol: builtin}}]
routes: [{{name: {route_name}, match: {{model: "*"}}, upstream: local}}]
"""
    volume = tmp_path / "volume"
    volume.mkdir()
    first, second = volume / "..2026_01_01", volume / "..2026_01_02"
    first.mkdir()
    second.mkdir()
    (first / "gateway.yaml").write_text(version("first-one"))
    (second / "gateway.yaml").write_text(version("second-on"))  # the same size
    stamp = (first / "gateway.yaml").stat().st_mtime_ns
    os.utime(second / "gateway.yaml", ns=(stamp, stamp))  # and the same time
    (volume / "..data").symlink_to(first.name)
    (volume / "gateway.yaml").symlink_to("..data/gateway.yaml")
    gw = GatewayProcess(volume / "gateway.yaml", tmp_path / "gateway.log")
    gw.port_file = tmp_path / "ports.json"
    with gw:
        def routes() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{gw.ports['admin']}/routes", timeout=5) as reply:
                return reply.read().decode()

        assert "first-one" in routes()
        (volume / "..data_tmp").symlink_to(second.name)
        os.replace(volume / "..data_tmp", volume / "..data")  # the atomic swap the kubelet makes
        wait_for(lambda: "second-on" in routes(), 5, "the swapped config to be loaded")
