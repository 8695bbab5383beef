"""The stall recipe's SSE client: clients of the ``openai`` listener that
ask for long streamed chat completions (the builtin ``text_generator``,
4096 tokens: ~1 MB of chunks each, several pipelined per connection, past
what the kernel's socket buffers hold) and never read. Each stream's writes
wait on its full socket: one stream per connection stays open, the gateway
holds a bounded part of the answers (RSS growth bounded), and nothing else
waits on them: health probes on the other listeners stay fast, with the
bounds of the stall recipe (tests/peers/stall_attack.py). When the
clients leave, their streams end and the memory budget is whole again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from peers.stall_attack import (
    MAX_BOUND,
    MEDIAN_BOUND,
    HealthProber,
    Probe,
    SseNeverReads,
    machine_slowdown,
    rss_bytes,
    send_queues,
)
from support import BUILTIN_REST_CONFIG, GatewayProcess, metric_value, scrape_metrics, wait_for, write_config

CONNECTIONS = 16
PIPELINED = 6  # streams asked on each connection: ~6 MB of chunks, past the ~4 MB the kernel buffers
HOLD = 3.0  # seconds the clients keep their connections unread once every writer waits
# What the stalled streams may add to the gateway's RSS: ~6 MiB measured.
# A writer that did not wait on its socket per chunk kept each connection's
# current stream (~1 MB of chunks) in the gateway: ~18 MiB.
RSS_GROWTH_BOUND = 12 << 20

# The builtin models behind an openai listener and the V2 REST one the probes use.
CONFIG = BUILTIN_REST_CONFIG.replace(
    "listeners:\n", 'listeners:\n  - {name: oai, protocol: openai, address: "127.0.0.1:0", max_tokens: 4096}\n')


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("sse-stall")
    with GatewayProcess(write_config(directory, CONFIG), directory / "gateway.log") as gw:
        yield gw


def stream_figures(gw: GatewayProcess) -> tuple[float, float, float]:
    """Open streams of the openai listener, its streams finished, and the bytes in flight."""
    samples = scrape_metrics(gw)
    return (metric_value(samples, "gateway_open_streams", listener="oai"),
            metric_value(samples, "gateway_stream_responses_per_request_count", listener="oai"),
            metric_value(samples, "gateway_inflight_bytes"))


def test_sse_clients_that_never_read(gateway: GatewayProcess) -> None:
    assert gateway.proc is not None
    pid = gateway.proc.pid
    slowdown = machine_slowdown()
    baseline = rss_bytes(pid)
    peak = baseline
    figures = [stream_figures(gateway)]
    queues = [send_queues(gateway.ports["oai"])]

    def writers_wait() -> bool:
        """Every connection has its stream open and a socket so full that the
        kernel holds over a MB of it, no more than at the last look."""
        nonlocal peak
        peak = max(peak, rss_bytes(pid))
        figures.append(stream_figures(gateway))
        queues.append(send_queues(gateway.ports["oai"]))
        return (figures[-1][0] == CONNECTIONS and len(queues[-1]) == CONNECTIONS and min(queues[-1]) > 1 << 20
                and queues[-1] == queues[-2])

    rest = HealthProber(gateway.ports["rest"], interval=0.02)
    admin = HealthProber(gateway.ports["admin"], "/healthz", interval=0.02)
    with rest as rest_probe, admin as admin_probe, SseNeverReads(gateway.ports["oai"], CONNECTIONS, PIPELINED):
        wait_for(writers_wait, 60, "every stream's writer to wait on its unread socket", 0.5)
        settled = figures[-1]
        held, rss = watch(gateway, HOLD)
        peak = max(peak, rss)
    report = (f"streams (open, finished, inflight bytes): settled {settled}, after {HOLD} s {held}; kernel "
              f"send queues {min(queues[-1]) / 2**20:.1f}-{max(queues[-1]) / 2**20:.1f} MiB; "
              f"RSS growth {(peak - baseline) / 2**20:.1f} MiB; "
              + "; ".join(probe_report(p) for p in (rest_probe, admin_probe))
              + f"; median bound {MEDIAN_BOUND * slowdown * 1000:.0f} ms (machine {slowdown:.2f}x)")
    # Flow-controlled: nothing more was sent while nobody read, every stream still waits.
    assert held[:2] == settled[:2], report
    # Of PIPELINED streams per connection, the ones the kernel's buffers took ended; the others wait.
    assert settled[1] < CONNECTIONS * (PIPELINED - 1), report
    assert peak - baseline <= RSS_GROWTH_BOUND, report
    for probe in (rest_probe, admin_probe):
        median, worst = probe.figures()
        assert probe.latencies and probe.failures == 0, report
        assert median <= MEDIAN_BOUND * slowdown and worst <= MAX_BOUND, report
    # The clients left: their streams end and give back what they held.
    wait_for(lambda: stream_figures(gateway)[0] == 0, 20, "the abandoned streams to end")
    wait_for(lambda: stream_figures(gateway)[2] == 0, 10, "gateway_inflight_bytes to come back to 0")
    assert gateway.proc.poll() is None
    log = gateway.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


def watch(gw: GatewayProcess, seconds: float) -> tuple[tuple[float, float, float], int]:
    """The stream figures after ``seconds`` of looking (the first change
    ends the look early: it fails the test) and the peak RSS meanwhile."""
    assert gw.proc is not None
    start = stream_figures(gw)
    figures, peak = start, rss_bytes(gw.proc.pid)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and figures[:2] == start[:2]:
        time.sleep(0.2)
        figures, peak = stream_figures(gw), max(peak, rss_bytes(gw.proc.pid))
    return figures, peak


def probe_report(probe: Probe) -> str:
    median, worst = probe.figures()
    return (f"{probe.name}: {len(probe.latencies)} answered, {probe.failures} failed, "
            f"median {median * 1000:.1f} ms, max {worst * 1000:.1f} ms")
