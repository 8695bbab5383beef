"""Latency of UM-Bridge calls: new TCP connection per call vs keep-alive.

Starts the Python reference server (``umbridge.serve_models``, via
tests/peers/umbridge_peer.py, loopback only) and a gateway in front of it,
then times sequential Evaluate calls of a 3-value model:

  direct   aiohttp client -> reference server, force_close on/off
           (exactly the two policies of the ``umbridge`` upstream's ``keepalive``)
  gateway  aiohttp keep-alive client -> gateway (UM-Bridge listener) ->
           reference server, upstream ``keepalive: false`` vs ``true``

Run: ``.venv/bin/python bench/umbridge_connections.py [CALLS]`` (default 2000).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from peers.umbridge_peer import UmbridgePeer  # noqa: E402
from support import GatewayProcess, write_config  # noqa: E402

BODY = b'{"name": "square", "input": [[1.0, 2.0, 3.0]], "config": {}}'
CONFIG = """
admin: {address: null}
listeners: [{name: umb, protocol: umbridge, address: "127.0.0.1:0"}]
upstreams:
  - {name: fresh, protocol: umbridge, endpoints: ["127.0.0.1:PEER"], keepalive: false}
  - {name: reuse, protocol: umbridge, endpoints: ["127.0.0.1:PEER"], keepalive: true}
routes:
  - {match: {model: square}, upstream: fresh}
  - {match: {model: square_reuse}, upstream: reuse, rewrite: {model: square}}
"""


async def timed(url: str, body: bytes, calls: int, force_close: bool) -> list[float]:
    connector = aiohttp.TCPConnector(force_close=force_close)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(50):  # warm up
            async with session.post(url, data=body) as response:
                await response.read()
        samples = []
        for _ in range(calls):
            start = time.perf_counter()
            async with session.post(url, data=body) as response:
                await response.read()
                assert response.status == 200, await response.text()
            samples.append(time.perf_counter() - start)
    return samples


def describe(label: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p90 = ms[int(0.9 * len(ms))]
    median, mean = statistics.median(ms), statistics.fmean(ms)
    return f"{label:<44} median {median:6.3f} ms   p90 {p90:6.3f} ms   mean {mean:6.3f} ms"


async def main(calls: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        with UmbridgePeer(directory) as peer:
            direct = f"http://{peer.address}/Evaluate"
            print(describe("direct, new connection per call", await timed(direct, BODY, calls, True)))
            print(describe("direct, keep-alive", await timed(direct, BODY, calls, False)))
            config = write_config(directory, CONFIG.replace("PEER", str(peer.port)))
            with GatewayProcess(config, directory / "gateway.log") as gateway:
                front = f"http://{gateway.url('umb')}/Evaluate"
                reuse_body = BODY.replace(b'"square"', b'"square_reuse"')
                print(describe("via gateway, upstream keepalive: false", await timed(front, BODY, calls, False)))
                print(describe("via gateway, upstream keepalive: true", await timed(front, reuse_body, calls, False)))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000))
