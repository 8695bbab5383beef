"""Per-call cost of the upstream HTTP transport (gateway/transport/http_client/pool.py)
against aiohttp's ClientSession configured as the V2 REST upstream used it,
side by side in one run, against the same small raw HTTP server.

The server runs in its own process (uvloop, a bare asyncio.Protocol that
answers every request from precomputed bytes), so the numbers are the
clients' own cost plus one loopback round trip. Arms alternate in rounds so
drift from other work on the machine hits both alike:

  seq    sequential POSTs of a small JSON body, small JSON answer (p50, p90)
  c16    16 concurrent callers for a fixed time (calls/s)
  4MiB   sequential calls answered with 4 MiB (p50)

Run: ``.venv/bin/python bench/upstream_http.py [ROUNDS]`` (default 5).
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
import uvloop  # noqa: E402

from gateway.config.address import Address  # noqa: E402
from gateway.runtime.tls import HttpClientTls  # noqa: E402
from gateway.transport.http_client.pool import UpstreamHttp  # noqa: E402

SMALL = b'{"model_name":"simple","outputs":[{"name":"OUTPUT0","datatype":"INT32","shape":[1,16],"data":[' + \
    b",".join(str(i).encode() for i in range(16)) + b"]}]}"
BIG = b"x" * (4 << 20)
REQUEST = b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[' + \
    b",".join(str(i).encode() for i in range(16)) + b"]}]}"
SEQ_CALLS, BIG_CALLS, C16_SECONDS = 2000, 30, 1.0


# --- the server (its own process) ---------------------------------------------------------

def serve() -> None:
    def answer(body: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    small, big = answer(SMALL), answer(BIG)

    class Server(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport, self.data = transport, b""

        def data_received(self, data: bytes) -> None:
            self.data += data
            while True:
                end = self.data.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.data[:end].lower()
                at = head.find(b"content-length:")
                length = int(head[at + 15:].split(b"\r\n", 1)[0]) if at >= 0 else 0
                if len(self.data) < end + 4 + length:
                    return
                self.transport.write(big if b" /big " in head else small)
                self.data = self.data[end + 4 + length:]

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Server, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.sleep(3600)

    uvloop.run(main())


# --- the clients ----------------------------------------------------------------------------

class Aiohttp:
    """aiohttp as gateway/protocols/v2_rest/backend.py used it before."""

    def __init__(self, port: int) -> None:
        connector = aiohttp.TCPConnector(limit=64, keepalive_timeout=4.0)
        self.session = aiohttp.ClientSession(f"http://127.0.0.1:{port}", connector=connector,
                                             timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))

    async def call(self, path: str) -> int:
        headers = {"Accept-Encoding": "identity", "Content-Type": "application/json", "x-request-id": "bench"}
        async with self.session.request("POST", path, data=REQUEST, headers=headers, allow_redirects=False) as r:
            chunks = [chunk async for chunk in r.content.iter_chunked(1 << 20)]
            return len(b"".join(chunks))

    async def close(self) -> None:
        await self.session.close()


class Transport:
    def __init__(self, port: int) -> None:
        self.http = UpstreamHttp(Address("127.0.0.1", port), HttpClientTls(), "bench", max_response=64 << 20,
                                 max_connections=64)

    async def call(self, path: str) -> int:
        reply = await self.http.request("POST", path, {"Content-Type": "application/json", "x-request-id": "bench"},
                                        REQUEST)
        return len(reply.body)

    async def close(self) -> None:
        await self.http.close()


async def sequential(client: Any, path: str, calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        await client.call(path)
        times.append(time.perf_counter() - started)
    return times


async def concurrent(client: Any, seconds: float) -> float:
    done = 0
    stop = time.perf_counter() + seconds

    async def caller() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await client.call("/small")
            done += 1

    await asyncio.gather(*(caller() for _ in range(16)))
    return done / seconds


async def bench(port: int, rounds: int) -> None:
    clients = {"aiohttp": Aiohttp(port), "transport": Transport(port)}
    seq: dict[str, list[float]] = {name: [] for name in clients}
    big: dict[str, list[float]] = {name: [] for name in clients}
    c16: dict[str, list[float]] = {name: [] for name in clients}
    for client in clients.values():  # warm up: connections open, code paths hot
        await sequential(client, "/small", 200)
        await sequential(client, "/big", 3)
    for _ in range(rounds):
        for name, client in clients.items():
            seq[name] += await sequential(client, "/small", SEQ_CALLS)
            big[name] += await sequential(client, "/big", BIG_CALLS)
            c16[name].append(await concurrent(client, C16_SECONDS))
    for client in clients.values():
        await client.close()

    def ms(values: list[float], q: int) -> float:
        return statistics.quantiles(values, n=100)[q - 1] * 1e3

    print(f"{'arm':<26}{'aiohttp':>12}{'transport':>12}{'ratio':>8}")
    rows = [("seq small p50 (µs)", 1e3 * ms(seq["aiohttp"], 50), 1e3 * ms(seq["transport"], 50)),
            ("seq small p90 (µs)", 1e3 * ms(seq["aiohttp"], 90), 1e3 * ms(seq["transport"], 90)),
            ("4 MiB reply p50 (ms)", ms(big["aiohttp"], 50), ms(big["transport"], 50)),
            ("c16 calls/s (median)", statistics.median(c16["aiohttp"]), statistics.median(c16["transport"]))]
    for label, old, new in rows:
        print(f"{label:<26}{old:>12.1f}{new:>12.1f}{new / old:>8.2f}")


def main() -> None:
    if sys.argv[1:] == ["--serve"]:
        serve()
        return
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        uvloop.run(bench(port, rounds))
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
