"""A client that hangs up is let go,
one hung upstream cannot starve the others on a listener, and client-facing
errors name the upstream cluster, never an endpoint address.

The gateway runs in its own process; the upstreams are stand-ins in this
process (peers/hung_upstream.py) that never answer, or answer garbage, and
record when the gateway gives up a call.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc
import orjson
import pytest
from graphstorm_payloads import MOVIELENS_SCHEMA, TARGET_MODEL, movielens

from gateway.protocols.v2_grpc import messages as pb
from peers.hung_upstream import HungGrpcServer, HungHttpServer
from support import GatewayProcess, free_port, metric_value, scrape_metrics, wait_for, write_config

SLOTS = 4  # limits.max_concurrent_requests of the disconnect gateway
ABANDONED = 10  # requests abandoned in a row: more than SLOTS, so a leaked slot shows
GIVE_UP_S = 1.0  # the upstream call must end this soon after its client left

IDENTITY_JSON = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.5, 2.5]}]})
UMBRIDGE_FORWARD = orjson.dumps({"name": "forward", "input": [[1.0, 2.0], [3.0]]})


def http_request(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def grpc_identity(model: str = "identity") -> bytes:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="UINT8", shape=[3])
    request.raw_input_contents.append(b"\1\2\3")
    return request.SerializeToString()


def grpc_call(channel: grpc.Channel) -> Any:
    return channel.unary_unary(pb.method_path("ModelInfer"))


def admin_json(gw: GatewayProcess, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{gw.ports['admin']}{path}", timeout=10) as reply:
        return json.loads(reply.read())


def cluster_state(gw: GatewayProcess, name: str) -> dict[str, Any]:
    return next(u for u in admin_json(gw, "/upstreams")["upstreams"] if u["name"] == name)


def post(gw: GatewayProcess, listener: str, path: str, body: bytes, headers: dict[str, str] | None = None,
         timeout: float = 10) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://{gw.url(listener)}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


# --- 1. a client that hangs up is let go, on every frontend ----------------------------------------


UNAVAILABLE_REPLY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@dataclass
class Hung:
    http: dict[str, HungHttpServer]  # by upstream name
    grpc: HungGrpcServer
    unavailable: HungHttpServer  # answers 503 at once


@pytest.fixture(scope="module")
def hung() -> Iterator[Hung]:
    servers = Hung({name: HungHttpServer().start() for name in ("hung-rest", "hung-umb", "hung-gs")},
                   HungGrpcServer().start(),
                   HungHttpServer(UNAVAILABLE_REPLY).start())
    yield servers
    for server in (*servers.http.values(), servers.unavailable):
        server.stop()
    servers.grpc.stop()


@pytest.fixture(scope="module")
def gateway(hung: Hung, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("disconnect")
    config = f"""
admin: {{address: "127.0.0.1:0"}}
limits: {{max_concurrent_requests: {SLOTS}}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
  - {{name: umb, protocol: umbridge, address: "127.0.0.1:0"}}
  - {{name: gs, protocol: graphstorm, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin}}
  - {{name: hung-rest, protocol: v2-rest, endpoints: ["{hung.http['hung-rest'].address}"], binary: always}}
  - {{name: hung-umb, protocol: umbridge, endpoints: ["{hung.http['hung-umb'].address}"]}}
  - {{name: hung-gs, protocol: graphstorm, endpoints: ["{hung.http['hung-gs'].address}"]}}
  - {{name: hung-grpc, protocol: v2-grpc, endpoints: ["{hung.grpc.address}"]}}
  - {{name: unavailable, protocol: v2-rest, endpoints: ["{hung.unavailable.address}"], binary: always,
      outlier_detection: {{consecutive_failures: 0}}}}
routes:
  - match: {{model: unavailable}}
    upstream: unavailable
    retry: {{attempts: 10, retry_on: [unavailable], backoff: 20s, max_backoff: 20s}}
  - {{match: {{model: hung-rest}}, upstream: hung-rest}}
  - {{match: {{model: hung-umb}}, upstream: hung-umb}}
  - {{match: {{model: hung-gs}}, upstream: hung-gs}}
  - {{match: {{model: hung-grpc}}, upstream: hung-grpc}}
  - match: {{model: gnn, listener: gs}}
    upstream: local
    options: {{graphstorm: {{graph_schema: "{MOVIELENS_SCHEMA}"}}}}
  - {{match: {{model: "*"}}, upstream: local}}
"""
    with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
        yield gw


@dataclass(frozen=True)
class Case:
    listener: str
    upstream: str
    request: bytes  # what the client sends before it hangs up (HTTP listeners)


GNN_PAYLOAD = orjson.dumps(movielens())
CASES = [
    Case("rest", "hung-rest", http_request("/v2/models/hung-rest/infer", IDENTITY_JSON)),
    Case("rest", "hung-grpc", http_request("/v2/models/hung-grpc/infer", IDENTITY_JSON)),
    Case("umb", "hung-umb", http_request("/Evaluate", orjson.dumps({"name": "hung-umb", "input": [[1.0]]}))),
    Case("gs", "hung-gs", http_request("/invocations", GNN_PAYLOAD, {TARGET_MODEL: "hung-gs"})),
    Case("grpc", "hung-grpc", b""),
    Case("grpc", "hung-rest", b""),
]


def served_elsewhere(gw: GatewayProcess, listener: str) -> None:
    """Another model on the same listener answers: no slot is left held."""
    if listener == "grpc":
        with grpc.insecure_channel(gw.url("grpc")) as channel:
            reply = pb.ModelInferResponse.FromString(grpc_call(channel)(grpc_identity(), timeout=10))
        assert reply.raw_output_contents[0] == b"\1\2\3"
        return
    path, body, headers = {"rest": ("/v2/models/identity/infer", IDENTITY_JSON, None),
                           "umb": ("/Evaluate", UMBRIDGE_FORWARD, None),
                           "gs": ("/invocations", GNN_PAYLOAD, {TARGET_MODEL: "gnn"})}[listener]
    status, answer = post(gw, listener, path, body, headers)
    assert status == 200, answer


def calls_of(hung: Hung, case: Case) -> tuple[Callable[[], int], Callable[[], list[float]]]:
    """(calls the upstream has seen, when each was given up) for the case's upstream."""
    if case.upstream == "hung-grpc":
        return (lambda: len(hung.grpc.started)), (lambda: hung.grpc.cancelled)
    server = hung.http[case.upstream]
    return (lambda: len(server.opened)), (lambda: server.closed)


def abandon(gw: GatewayProcess, case: Case, seen: Callable[[], int]) -> float:
    """Send the case's request, wait until it reaches the upstream, hang up;
    the time the client left."""
    before = seen()
    if case.listener == "grpc":
        with grpc.insecure_channel(gw.url("grpc")) as channel:
            future = grpc_call(channel).future(grpc_identity(case.upstream))
            wait_for(lambda: seen() > before, 5, "the call to reach the upstream")
            future.cancel()
            return time.monotonic()
    with socket.create_connection(("127.0.0.1", gw.ports[case.listener]), timeout=5) as sock:
        sock.sendall(case.request)
        wait_for(lambda: seen() > before, 5, "the request to reach the upstream")
    return time.monotonic()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.listener}-to-{c.upstream}")
def test_client_disconnect_cancels_the_upstream_call(gateway: GatewayProcess, hung: Hung, case: Case) -> None:
    seen, given_up = calls_of(hung, case)
    start = len(given_up())
    for i in range(ABANDONED):
        left = abandon(gateway, case, seen)
        wait_for(lambda n=start + i + 1: len(given_up()) >= n, 5, "the upstream call to end")
        delay = given_up()[start + i] - left
        assert delay < GIVE_UP_S, f"request {i}: the upstream call ended {delay:.2f}s after its client left"
    served_elsewhere(gateway, case.listener)
    # Nothing leaked: the cluster's counters and the in-flight gauge are back to zero.
    wait_for(lambda: cluster_state(gateway, case.upstream)["in_flight"] == 0, 5, "the cluster's in_flight to drop")
    state = cluster_state(gateway, case.upstream)
    assert (state["pending"], state["retries_in_flight"]) == (0, 0)
    assert all(e["in_flight"] == 0 for e in state["endpoints"])
    wait_for(lambda: metric_value(scrape_metrics(gateway), "gateway_requests_in_flight", listener=case.listener) == 0,
             5, "the listener's in-flight gauge to drop")


def test_a_client_leaving_during_a_retry_backoff_ends_the_retries(gateway: GatewayProcess, hung: Hung) -> None:
    """The upstream answers 503 and the route retries after a long backoff:
    the client leaves, the retry is dropped and its budget slot freed."""
    request = http_request("/v2/models/unavailable/infer", IDENTITY_JSON)
    with socket.create_connection(("127.0.0.1", gateway.ports["rest"]), timeout=5) as sock:
        sock.sendall(request)
        wait_for(lambda: cluster_state(gateway, "unavailable")["retries_in_flight"] == 1, 10, "a retry to wait")
    left = time.monotonic()
    tries = len(hung.unavailable.opened)
    wait_for(lambda: cluster_state(gateway, "unavailable")["retries_in_flight"] == 0, 5, "the retry to end")
    assert time.monotonic() - left < GIVE_UP_S + 0.5
    state = cluster_state(gateway, "unavailable")
    assert (state["in_flight"], state["pending"]) == (0, 0)
    time.sleep(0.3)
    assert len(hung.unavailable.opened) == tries  # no attempt after the client left


def status_of(line: str) -> str:
    return next((w.split("=", 1)[1] for w in line.split() if w.startswith("status=")), "")


def test_a_client_leaving_while_its_answer_is_written_is_logged_as_499(gateway: GatewayProcess) -> None:
    """The JSON answer (~32 MB, written by aiohttp after the handler has
    returned) is larger than the socket buffers: the client reads its first
    bytes, then hangs up while the gateway still writes."""
    size = 8 << 20
    head = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [size],
                                     "parameters": {"binary_data_size": size}}]})
    request_id = f"big-answer-{time.monotonic_ns()}"
    request = http_request("/v2/models/identity/infer", head + b"\xff" * size, {
        "Inference-Header-Content-Length": str(len(head)), "X-Request-Id": request_id})
    with socket.create_connection(("127.0.0.1", gateway.ports["rest"]), timeout=10) as sock:
        sock.sendall(request)
        assert sock.recv(16).startswith(b"HTTP/1.1 200")
    line = wait_for(lambda: [line for line in gateway.log().splitlines() if f"request_id={request_id}" in line],
                    5, "the request's access-log line")
    assert len(line) == 1 and status_of(line[0]) == "499", line


def test_disconnects_are_logged_as_499_without_traceback(gateway: GatewayProcess) -> None:
    """(Runs after the cases above.) 499 / CANCELLED at INFO, never an ERROR."""
    log = gateway.log()
    lines = [line for line in log.splitlines() if "route=" in line or "status=" in line]
    hung_lines = [line for line in lines if "model=hung-" in line]
    statuses = Counter(status_of(line) for line in hung_lines)
    assert statuses["499"] >= ABANDONED and statuses["CANCELLED"] >= ABANDONED, statuses
    assert set(statuses) <= {"499", "CANCELLED"}, statuses
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


# --- 2. one hung upstream cannot starve the others on its listener --------------------------------


FLOOD = 300  # more than the listener's default 256 slots
HUNG_CLUSTER_HOLDS = 96 + 32  # circuit_breaker defaults: max_requests + max_pending


@pytest.fixture(scope="module")
def defaults_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, HungHttpServer]]:
    """Default limits everywhere: one listener, a hung upstream and a healthy one."""
    directory = tmp_path_factory.mktemp("starve")
    hung_server = HungHttpServer().start()
    config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams:
  - {{name: local, protocol: builtin}}
  - {{name: stuck, protocol: v2-rest, endpoints: ["{hung_server.address}"], binary: always}}
routes:
  - {{match: {{model: stuck}}, upstream: stuck}}
  - {{match: {{model: "*"}}, upstream: local}}
"""
    try:
        with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
            yield gw, hung_server
    finally:
        hung_server.stop()


async def test_a_hung_upstream_cannot_take_the_listener_from_other_models(
        defaults_gateway: tuple[GatewayProcess, HungHttpServer]) -> None:
    gw, hung_server = defaults_gateway
    base = f"http://{gw.url('rest')}"
    answered: list[tuple[int, str]] = []

    async def stuck(session: aiohttp.ClientSession) -> None:
        async with session.post(base + "/v2/models/stuck/infer", data=IDENTITY_JSON) as reply:
            answered.append((reply.status, (await reply.json())["error"]))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        flood = [asyncio.create_task(stuck(session)) for _ in range(FLOOD)]
        try:
            deadline = time.monotonic() + 20
            while len(answered) < FLOOD - HUNG_CLUSTER_HOLDS and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            # The overflow is refused by the upstream's breaker, without waiting, the rest stay held.
            statuses = Counter(status for status, _ in answered)
            assert statuses == {503: FLOOD - HUNG_CLUSTER_HOLDS}, statuses
            assert all("upstream 'stuck' is at its limits" in error for _, error in answered), answered[:3]
            state = await asyncio.to_thread(cluster_state, gw, "stuck")
            assert (state["in_flight"], state["pending"]) == (96, 32)
            # Other models on the same listener are served meanwhile.
            for _ in range(5):
                async with session.post(base + "/v2/models/identity/infer", data=IDENTITY_JSON) as reply:
                    assert reply.status == 200, await reply.text()
        finally:
            for task in flood:
                task.cancel()
            await asyncio.gather(*flood, return_exceptions=True)
    # The flood's clients have gone: every slot and upstream connection is let go.
    await asyncio.to_thread(wait_for, lambda: cluster_state(gw, "stuck")["in_flight"] == 0, 10, "slots to free")
    assert cluster_state(gw, "stuck")["pending"] == 0
    await asyncio.to_thread(wait_for, lambda: hung_server.open_now == 0, 10, "upstream connections to close")


def test_gateway_check_warns_when_an_upstream_can_hold_a_whole_listener(tmp_path: Any) -> None:
    import subprocess
    import sys

    from support import REPO

    config = write_config(tmp_path, f"""
limits: {{max_concurrent_requests: 100}}
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams:
  - {{name: local, protocol: builtin}}
  - {{name: greedy, protocol: v2-rest, endpoints: ["127.0.0.1:{free_port()}"]}}
  - name: modest
    protocol: v2-rest
    endpoints: ["127.0.0.1:{free_port()}"]
    circuit_breaker: {{max_requests: 40, max_pending: 10}}
routes: [{{match: {{model: "*"}}, upstream: local}}]
""")
    result = subprocess.run([sys.executable, "-m", "gateway", "check", "--config", str(config)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stdout.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "upstream 'greedy'" in warnings[0] and "(128)" in warnings[0], result.stdout


# --- 3. client-facing errors name the upstream, never an endpoint address ---------------------------

GARBAGE = b"SSH-2.0-not-what-you-expected\r\n\r\n\x00\xff garbage"
PROTOCOLS = {"rest": "v2-rest", "grpc": "v2-grpc", "umb": "umbridge", "gs": "graphstorm"}


@dataclass
class Faulty:
    gateway: GatewayProcess
    ports: dict[str, int]  # upstream name -> the port of its endpoint


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faulty]:
    """For each listener, upstreams of its protocol that refuse connections,
    answer garbage, or never answer (behind a per-try timeout)."""
    directory = tmp_path_factory.mktemp("faulty")
    servers = [HungHttpServer(GARBAGE).start(), HungHttpServer().start()]
    ports: dict[str, int] = {}
    upstreams, routes = [], []
    for listener, protocol in PROTOCOLS.items():
        for fault, port in (("refused", free_port()), ("garbage", servers[0].port), ("silent", servers[1].port)):
            name = f"{fault}-{listener}"
            ports[name] = port
            options = ", binary: always" if protocol == "v2-rest" else ""
            upstreams.append(f'  - {{name: {name}, protocol: {protocol}, endpoints: ["127.0.0.1:{port}"]{options}}}')
            retry = ", retry: {attempts: 1, per_try_timeout: 300ms}" if fault == "silent" else ""
            routes.append(f"  - {{match: {{model: {name}}}, upstream: {name}{retry}}}")
    listeners = "\n".join(f'  - {{name: {n}, protocol: {p}, address: "127.0.0.1:0"}}' for n, p in PROTOCOLS.items())
    config = "admin: {address: null}\nlisteners:\n" + listeners + "\nupstreams:\n" + "\n".join(upstreams) + \
        "\nroutes:\n" + "\n".join(routes) + "\n"
    try:
        with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
            yield Faulty(gw, ports)
    finally:
        for server in servers:
            server.stop()


def client_error(gw: GatewayProcess, listener: str, model: str, request_id: str) -> tuple[str, str]:
    """(status, the whole error the client got) for a request to ``model``."""
    if listener == "grpc":
        with grpc.insecure_channel(gw.url("grpc")) as channel:
            try:
                grpc_call(channel)(grpc_identity(model), timeout=10, metadata=(("x-request-id", request_id),))
            except grpc.RpcError as error:
                return error.code().name, error.details() or ""
        raise AssertionError("the call succeeded")
    path, body, headers = {"rest": (f"/v2/models/{model}/infer", IDENTITY_JSON, {}),
                           "umb": ("/Evaluate", orjson.dumps({"name": model, "input": [[1.0]]}), {}),
                           "gs": ("/invocations", GNN_PAYLOAD, {TARGET_MODEL: model})}[listener]
    status, answer = post(gw, listener, path, body, {**headers, "X-Request-Id": request_id})
    error = orjson.loads(answer)["error"]
    assert error, answer  # (GraphStorm answers errors in its envelope, with HTTP 200)
    return str(status), answer.decode()


@pytest.mark.parametrize("listener", PROTOCOLS)
@pytest.mark.parametrize("fault", ["refused", "garbage", "silent"])
def test_upstream_errors_name_the_cluster_and_log_the_address(faulty: Faulty, listener: str, fault: str) -> None:
    name = f"{fault}-{listener}"
    port = faulty.ports[name]
    request_id = f"req-{name}-{time.monotonic_ns()}"
    status, error = client_error(faulty.gateway, listener, name, request_id)
    assert name in error, (status, error)
    assert "127.0.0.1" not in error and str(port) not in error, (status, error)
    # The address is in the gateway's log, with the request id, for the operator
    # (written by the log's own thread: it may land a moment after the answer).
    def logged() -> list[str]:
        return [line for line in faulty.gateway.log().splitlines()
                if request_id in line and f"127.0.0.1:{port}" in line and "WARNING" in line]

    try:
        wait_for(logged, 5.0, "the failure's log line")
    except TimeoutError:
        raise AssertionError(faulty.gateway.log()[-2000:]) from None


@pytest.mark.parametrize(("text", "expected"), [
    ("failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.5:8001: Connection refused",
     "failed to connect to all addresses; last error: UNKNOWN: <address>: Connection refused"),
    ("ipv6:%5B::1%5D:8001: Socket closed; [fe80::1%eth0]:80", "<address>: Socket closed; <address>"),
    ("Connect call failed ('10.0.0.5', 8001)", "Connect call failed <address>"),
    ("see http://10.0.0.5:8000/v2 or triton.svc.cluster.local", "see <address> or <address>"),
    ("DNS resolution failed for triton.svc.cluster.local:8001", "DNS resolution failed for <address>"),
    # Not addresses: shapes, slices, versions, durations.
    ("output 'OUTPUT0': has 1 data elements but shape [4] needs 4; dims [2, 3] [1:2] v1.2.3 within 0.5s",
     "output 'OUTPUT0': has 1 data elements but shape [4] needs 4; dims [2, 3] [1:2] v1.2.3 within 0.5s"),
])
def test_addresses_are_cut_from_upstream_words(text: str, expected: str) -> None:
    from gateway.config.address import Address
    from gateway.core.addresses import without_addresses

    assert without_addresses(text, Address("triton.svc.cluster.local", 8001)) == expected


# --- 4. no hidden bound on a call: only the route's deadline, if any --------------------------------


async def test_http_upstreams_have_no_total_timeout_of_their_own() -> None:
    """A UM-Bridge model may run for hours, so only the data plane's
    deadline bounds a call: the HTTP transport every HTTP upstream uses
    bounds the connection attempt only (CONNECT_TIMEOUT)."""
    from types import SimpleNamespace

    from gateway.protocols import registry
    from gateway.transport.http_client.pool import UpstreamHttp
    from gateway.transport.upstream import CONNECT_TIMEOUT
    from support import parse_yaml_config

    config = parse_yaml_config("""
listeners: [{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}]
upstreams:
  - {name: rest, protocol: v2-rest, endpoints: ["127.0.0.1:1"]}
  - {name: umb, protocol: umbridge, endpoints: ["127.0.0.1:1"]}
  - {name: gs, protocol: graphstorm, endpoints: ["127.0.0.1:1"]}
routes: [{match: {model: "*"}, upstream: rest}]
""")
    for upstream in config.upstreams:
        client = registry.load(upstream.protocol, "backend")(upstream, upstream.endpoints[0],
                                                               SimpleNamespace(config=config))
        await client.start()
        try:
            http = client.http  # type: ignore[attr-defined]
            assert isinstance(http, UpstreamHttp), upstream.protocol
            assert http.connect_timeout == CONNECT_TIMEOUT, upstream.protocol
        finally:
            await client.close()
