"""Measures for ``bench/run.py`` scenario j (saturation): the gateway's own
overhead as its ``gateway_overhead_seconds`` histogram reports it, and
load-aware picking against ``least_request`` with one endpoint loaded behind
the gateway's back (the set-up of tests/test_load_aware.py, reused)."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from test_load_aware import MODEL, PAYLOAD, endpoint_requests, gateway_config, offered_load, p99

from peers.echo_gateway import rest_base, upstream_state
from peers.load import infer
from peers.mlserver import MLServerPeer
from support import GatewayProcess, free_port, wait_for, write_config

OVERHEAD = "gateway_overhead_seconds"


class Histogram:
    """One histogram series as scraped: cumulative bucket counts by upper
    bound (``inf`` last), its sum and count."""

    def __init__(self, buckets: dict[float, float], total: float, count: float) -> None:
        self.buckets, self.sum, self.count = buckets, total, count

    def __sub__(self, earlier: Histogram) -> Histogram:
        """What was observed between two scrapes."""
        return Histogram({bound: n - earlier.buckets.get(bound, 0.0) for bound, n in self.buckets.items()},
                         self.sum - earlier.sum, self.count - earlier.count)

    def quantile(self, q: float) -> float:
        """As PromQL's ``histogram_quantile``: linear within the bucket that
        holds the rank (the lowest bucket from 0)."""
        rank, lower, below = q * self.count, 0.0, 0.0
        for bound, cumulative in sorted(self.buckets.items()):
            if cumulative >= rank:
                if bound == float("inf"):
                    return lower
                inside = cumulative - below
                return lower + (bound - lower) * ((rank - below) / inside if inside else 0.0)
            lower, below = bound, cumulative
        return float("nan")


def scrape_histogram(admin_port: int, name: str, **labels: str) -> Histogram:
    """``name``'s series with ``labels`` from the gateway's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    buckets: dict[float, float] = {}
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not all(sample.labels.get(k) == v for k, v in labels.items()):
                continue
            if sample.name == f"{name}_bucket":
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
            elif sample.name == f"{name}_sum":
                total += sample.value
            elif sample.name == f"{name}_count":
                count += sample.value
    return Histogram(buckets, total, count)


def load_aware_against_least_request(workdir: Path) -> dict[str, float]:
    """Two MLServers (A on 127.0.0.1, B on 127.0.0.2) of a 20 ms model, A
    loaded by direct callers; the same offered load through the gateway by
    ``load_aware`` and by ``least_request``: each one's p99 (ms) and the
    share of load_aware's calls that went to B."""
    metrics_port = free_port()  # one number on both hosts, as on two machines
    peers = [MLServerPeer(workdir / f"mls-{host}", [MODEL], host, metrics_port) for host in ("127.0.0.1", "127.0.0.2")]
    for peer in peers:
        peer.workdir.mkdir()
    starting = [threading.Thread(target=peer.start) for peer in peers]  # their start-ups overlap
    try:
        for thread in starting:
            thread.start()
        for thread in starting:
            thread.join()
        a, b = peers
        if any(peer.proc is None or peer.proc.poll() is not None for peer in peers):
            raise RuntimeError("an MLServer did not start")
        with GatewayProcess(write_config(workdir, gateway_config(a, b, 0), "load-aware.yaml"),
                            workdir / "load-aware.log") as gw:
            wait_for(lambda: all(e["load"] is not None for e in upstream_state(gw, "aware")["endpoints"]), 20,
                     "both endpoints' loads read")
            return asyncio.run(_compare(gw, a, b))
    finally:
        for peer in peers:
            peer.stop()


async def _compare(gw: GatewayProcess, a: MLServerPeer, b: MLServerPeer) -> dict[str, float]:
    async with aiohttp.ClientSession() as session:  # connections to both endpoints open before measuring
        for model in ("via_aware", "via_least") * 4:
            if not (await infer(session, rest_base(gw), model, payload=PAYLOAD)).ok:
                raise RuntimeError(f"{model}: a warm-up call failed")
    before = endpoint_requests(gw, "aware")
    aware = await offered_load(gw, a, "via_aware")
    after = endpoint_requests(gw, "aware")
    least = await offered_load(gw, a, "via_least")
    failed = [r for r in aware + least if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} calls failed, e.g. {failed[0]}")
    to_b = after[b.rest_address] - before[b.rest_address]
    return {"load_aware": p99(aware) * 1000, "least_request": p99(least) * 1000, "to_b": to_b / len(aware)}
