"""Hot reload and graceful drain of a gateway process under load, in front
of V2 stand-in processes (peers/echo_upstream.py) reached through the
product's ``v2-rest`` and ``v2-grpc`` upstream clients."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from peers.echo_gateway import admin_call, rest_base, until
from peers.echo_upstream import WIRES, EchoServer
from peers.load import PAYLOAD, Result, assert_all_answered, infer, run_load
from support import GatewayProcess, metric_value, scrape_metrics, wait_for, write_config


def config(a: EchoServer, b: EchoServer, target: str, extra: str = "", bad: str = "") -> str:
    """Upstreams ``a-{wire}`` and ``b-{wire}`` for each wire; model ``m-{wire}``
    goes to ``{target}-{wire}`` (route ``main-{wire}``); ``bad``: a route first."""
    upstreams = "".join(f'  - {{name: {name}-{wire}, protocol: {wire_protocol}, '
                        f'endpoints: ["{at.address_for(wire_protocol)}"]}}\n'
                        for wire, wire_protocol in WIRES.items() for name, at in (("a", a), ("b", b)))
    routes = "".join(f"  - {{name: main-{wire}, match: {{model: m-{wire}}}, upstream: {target}-{wire}}}\n"
                     for wire in WIRES)
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams:
{upstreams}routes:
{bad}{routes}
{extra}
"""


def gateway(directory: Path, text: str) -> GatewayProcess:
    return GatewayProcess(write_config(directory, text), directory / "gateway.log")


def routed_to(gw: GatewayProcess) -> set[str]:
    """The upstreams of the routes, as the admin endpoint shows them."""
    return {route.split(" -> ")[1].split()[0] for route in admin_call(gw, "/routes")[1]["routes"]}


def loads(gw: GatewayProcess, stop: asyncio.Event, concurrency: int) -> list[asyncio.Future[list[Result]]]:
    """Load on every wire's model until ``stop``."""
    return [asyncio.ensure_future(run_load(rest_base(gw), f"m-{wire}", duration=60, concurrency=concurrency,
                                           stop=stop)) for wire in WIRES]


async def more_answers(server: EchoServer, count: int, timeout: float = 10.0) -> None:
    """Wait (off the loop, bounded) until ``server`` answered ``count`` more calls."""
    start = server.stats()["answered"]
    await asyncio.to_thread(wait_for, lambda: server.stats()["answered"] >= start + count, timeout,
                            f"{count} more answers from {server.name}")


BAD_SPLIT = "  - {match: {model: '*'}, split: [{upstream: a-rest, weight: 60}, {upstream: b-rest, weight: 30}]}\n"
Servers = tuple[EchoServer, EchoServer]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """Two stand-ins, A and B, shared by the tests (each starts its own gateway)."""
    directory = tmp_path_factory.mktemp("echo")
    a, b = EchoServer("A", directory), EchoServer("B", directory)
    try:
        EchoServer.start_all([a, b])
        yield a, b
    finally:
        a.stop()
        b.stop()


async def test_reload_under_load_switches_atomically_and_rejects_bad_files(tmp_path: Path, servers: Servers) -> None:
    a, b = servers
    with gateway(tmp_path, config(a, b, "a")) as gw:
        path = gw.config_path
        stop = asyncio.Event()
        load = loads(gw, stop, 3)
        await more_answers(a, 40)

        path.write_text(config(a, b, "b"))
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGHUP)
        await until(lambda: routed_to(gw) == {"b-rest", "b-grpc"}, 5, "SIGHUP to apply the new routes")
        switched_at = time.monotonic()
        await more_answers(b, 40)

        path.write_text(config(a, b, "a", "bogus_section: 1", BAD_SPLIT))
        status, body = await asyncio.to_thread(admin_call, gw, "/reload", "POST")
        assert status == 400 and not body["reloaded"]
        assert "routes[0].split: weights must add up to 100, got 90" in body["problems"]
        assert "bogus_section: unknown key" in body["problems"]
        path.write_text(config(a, b, "a").replace("address: \"127.0.0.1:0\"}]", "address: \"127.0.0.1:1\"}]"))
        status, body = await asyncio.to_thread(admin_call, gw, "/reload", "POST")
        assert status == 400 and body["problems"][0].startswith("listeners: changed, which needs a restart")
        await more_answers(b, 40)  # the old config keeps serving
        assert routed_to(gw) == {"b-rest", "b-grpc"}
        after_failures = scrape_metrics(gw)

        path.write_text(config(a, b, "a"))
        last_post_at = time.monotonic()
        status, body = await asyncio.to_thread(admin_call, gw, "/reload", "POST")
        assert status == 200 and body["reloaded"]
        back_at = time.monotonic()
        await more_answers(a, 40)
        stop.set()
        results = {wire: await done for wire, done in zip(WIRES, load, strict=True)}
        _, reloads = admin_call(gw, "/reload")
        at_end = scrape_metrics(gw)
        # (the log is written by its own thread: the last lines may lag the answers)
        expected = ("reload rejected, the running configuration keeps serving",
                    "routes[0].split: weights must add up to 100, got 90")
        log = wait_for(lambda: all(line in (text := gw.log()) for line in expected) and text, 5,
                       "the rejected reloads logged")
    for wire in WIRES:
        assert_all_answered(results[wire], at_least=40)
        # Started after the switch was visible, or done before the next reload was asked for: B.
        assert all(r.server == "B" for r in results[wire]
                   if switched_at < r.started and r.started + r.elapsed < last_post_at), wire
        assert all(r.server == "A" for r in results[wire] if r.started > back_at), wire
    assert reloads["successes_total"] == 2 and reloads["failures_total"] == 2
    assert reloads["last_success_time"] > reloads["last_failure_time"] > 0
    assert "reload rejected, the running configuration keeps serving" in log
    # The same on /metrics.
    assert metric_value(after_failures, "gateway_config_reloads_total", result="success") == 1
    assert metric_value(after_failures, "gateway_config_reloads_total", result="failure") == 2
    assert metric_value(after_failures, "gateway_config_last_reload_successful") == 0
    assert metric_value(at_end, "gateway_config_reloads_total", result="success") == 2
    assert metric_value(at_end, "gateway_config_reloads_total", result="failure") == 2
    assert metric_value(at_end, "gateway_config_last_reload_successful") == 1
    assert metric_value(at_end, "gateway_config_last_reload_success_timestamp_seconds") \
        == pytest.approx(reloads["last_success_time"], abs=1.0)
    assert "routes[0].split: weights must add up to 100, got 90" in log


async def test_reload_on_file_change(tmp_path: Path, servers: Servers) -> None:
    a, b = servers
    watch = "reload: {watch_interval: 200ms}"
    with gateway(tmp_path, config(a, b, "a", watch)) as gw:
        async with aiohttp.ClientSession() as session:
            async def servers_now() -> list[str]:
                return [(await infer(session, rest_base(gw), f"m-{wire}")).server for wire in WIRES]

            assert await servers_now() == ["A", "A"]
            gw.config_path.write_text(config(a, b, "b", watch) + "\n# changed\n")
            deadline = time.monotonic() + 5
            while await servers_now() != ["B", "B"]:
                assert time.monotonic() < deadline, "the file change was not picked up"
                await asyncio.sleep(0.1)


async def test_sigterm_under_load_answers_everything_accepted(tmp_path: Path, servers: Servers) -> None:
    a, b = servers
    delay = 2.0  # long enough that a loaded machine still sees readiness drop well inside it
    gw = gateway(tmp_path, config(a, b, "a", f"drain: {{delay: {delay}s, timeout: 5s}}"))
    try:
        a.control(delay=0.1)  # requests are in flight when the signal comes
        gw.start()
        stop = asyncio.Event()
        load = loads(gw, stop, 4)
        await more_answers(a, 20)
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        # Readiness drops as soon as the signal is handled, long before the listeners close...
        await until(lambda: admin_call(gw, "/readyz") == (503, {"ready": False}), delay, "readiness to turn false")
        # ...and new work is still taken until they do.
        async with aiohttp.ClientSession() as session:
            late = [await infer(session, rest_base(gw), f"m-{wire}") for wire in WIRES]
        code = await asyncio.to_thread(gw.proc.wait, 15)
        exited = time.monotonic()
        async with aiohttp.ClientSession() as session:
            refused = await infer(session, rest_base(gw), "m-rest")
        stop.set()
        results = [r for done in load for r in await done]
    finally:
        gw.stop()
        a.control(delay=0)
    assert code == 0
    assert delay < exited - signalled < delay + 3
    assert all(r.ok and r.started < signalled + delay for r in late), late
    accepted = [r for r in results if r.started < signalled + delay - 0.3]
    assert accepted and all(r.ok for r in accepted), [r for r in accepted if not r.ok][:5]
    # After the listener closed, clients are refused: no half answers, no 5xx.
    assert all(r.status in (200, 0) for r in results)
    assert refused.status == 0, refused


async def test_drain_timeout_bounds_in_flight_requests(tmp_path: Path, servers: Servers) -> None:
    a, b = servers
    gw = gateway(tmp_path, config(a, b, "a", "drain: {delay: 0s, timeout: 1s}"))
    try:
        gw.start()
        async with aiohttp.ClientSession() as session:
            def slow(ms: int) -> dict[str, Any]:
                return {**PAYLOAD, "parameters": {"delay_ms": ms}}

            arrived = a.stats()["infer"]
            short = [asyncio.ensure_future(infer(session, rest_base(gw), f"m-{wire}", payload=slow(400)))
                     for wire in WIRES]
            long = [asyncio.ensure_future(infer(session, rest_base(gw), f"m-{wire}", payload=slow(8000)))
                    for wire in WIRES]
            await until(lambda: a.stats()["infer"] >= arrived + 4, 10, "every call to reach the upstream")
            assert gw.proc is not None
            gw.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            code = await asyncio.to_thread(gw.proc.wait, 15)
            stopped_after = time.monotonic() - signalled
            finished, cut = await asyncio.gather(*short), await asyncio.gather(*long)
    finally:
        gw.stop()
    assert code == 0 and stopped_after < 3
    assert all(r.ok for r in finished), finished  # finished within the drain timeout
    # Cut off at the drain timeout, not left hanging.
    assert all(r.status == 0 and r.elapsed < 4 for r in cut), cut


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
