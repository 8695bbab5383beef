"""DNS discovery of upstream endpoints (upstreams behind a Kubernetes
Service), over real sockets.

A tiny DNS server (tests/peers/dns_server.py, its own process, real DNS over
UDP) answers for ``models.test`` from a file each test rewrites; V2 servers
(gateway processes serving the builtin models) listen on 127.0.0.2,
127.0.0.3, ... at one port, like the pods behind a headless Service; the
gateway under test is pointed at that nameserver through ``dns.nameservers``
and balances over what the name resolves to, for a REST and a gRPC upstream.
The DNS message code has unit tests at the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gateway.config.address import Address
from gateway.config.node import ConfigError
from gateway.config.upstreams import DnsDiscovery, HealthCheck, LoadBalancing, UpstreamConfig
from gateway.dataplane.cluster import discovery, dnsclient
from gateway.dataplane.cluster.cluster import Cluster
from gateway.observability.counters import Counters, Event
from peers.echo_gateway import upstream_state
from peers.fake_upstream import FakeFleet
from support import (
    REPO,
    SIMPLE_INFER_REQUEST,
    GatewayProcess,
    metric_value,
    scrape_metrics,
    stop_process,
    wait_for,
    write_config,
)

NAME = "models.test"
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
WAIT = 15.0  # seconds for a refresh (200 ms) and a health round to show, on a loaded machine


def common_port(hosts: tuple[str, ...]) -> int:
    """A TCP port free on every one of ``hosts`` (the pods share one port)."""
    for _ in range(50):
        sockets: list[socket.socket] = []
        try:
            first = socket.socket()
            sockets.append(first)
            first.bind((hosts[0], 0))
            port = int(first.getsockname()[1])
            for host in hosts[1:]:
                other = socket.socket()
                sockets.append(other)
                other.bind((host, port))
            return port
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no common free port")


class DnsServer:
    def __init__(self, directory: Path) -> None:
        self.records = directory / "records.json"
        self.port_file = directory / "dns.port"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def answer(self, addresses: list[str]) -> None:
        temporary = self.records.with_suffix(".tmp")
        temporary.write_text(json.dumps({NAME: addresses}))
        temporary.replace(self.records)  # the server never reads a half-written file

    def start(self) -> DnsServer:
        self.port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-m", "peers.dns_server", str(self.records),
                                      str(self.port_file)], cwd=REPO / "tests")
        wait_for(lambda: self.port_file.exists() and self.port_file.read_text(), 10, "the DNS server")
        self.port = int(self.port_file.read_text())
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


class Backends:
    """A V2 server (REST and gRPC listeners) per loopback address, one port each."""

    def __init__(self, directory: Path, hosts: tuple[str, ...]) -> None:
        self.rest_port, self.grpc_port = common_port(hosts), common_port(hosts)
        self.processes: dict[str, GatewayProcess] = {}
        for host in hosts:
            config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "{host}:{self.rest_port}"}}
  - {{name: grpc, protocol: v2-grpc, address: "{host}:{self.grpc_port}"}}
upstreams: [{{name: local, protocol: builtin}}]
routes: [{{match: {{model: "*"}}, upstream: local}}]
"""
            self.processes[host] = GatewayProcess(write_config(directory, config, f"{host}.yaml"),
                                                  directory / f"{host}.log")

    def served(self, host: str) -> float:
        """Inference requests the server at ``host`` answered."""
        return metric_value(scrape_metrics(self.processes[host]), "gateway_requests_total")


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backends]:
    started = Backends(tmp_path_factory.mktemp("backends"), HOSTS)
    try:
        for process in started.processes.values():
            process.start()
        yield started
    finally:
        for process in started.processes.values():
            if process.proc is not None and process.proc.poll() is None:
                process.stop()


@pytest.fixture
def dns(tmp_path: Path) -> Iterator[DnsServer]:
    server = DnsServer(tmp_path)
    server.answer(list(HOSTS))
    try:
        yield server.start()
    finally:
        server.stop()


def front(directory: Path, dns: DnsServer, backends: Backends, check: bool = False) -> GatewayProcess:
    discovery = f'dns: {{nameservers: ["127.0.0.1:{dns.port}"], refresh: 200ms, timeout: 1s}}'
    health = ", health_check: {interval: 200ms, timeout: 1s, unhealthy_threshold: 1}" if check else ""
    config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams:
  - {{name: via-rest, protocol: v2-rest, endpoints: ["{NAME}:{backends.rest_port}"], {discovery}{health}}}
  - {{name: via-grpc, protocol: v2-grpc, endpoints: ["{NAME}:{backends.grpc_port}"], {discovery}{health}}}
routes:
  - match: {{headers: {{x-upstream: via-grpc}}}}
    upstream: via-grpc
    retry: {{attempts: 3, retry_on: [connect-failure, reset], backoff: 5ms}}
  - match: {{model: "*"}}
    upstream: via-rest
    retry: {{attempts: 3, retry_on: [connect-failure, reset], backoff: 5ms}}
"""
    return GatewayProcess(write_config(directory, config, "front.yaml"), directory / "front.log")


def infer(gw: GatewayProcess, upstream: str, count: int) -> None:
    """``count`` requests through ``upstream`` (checked: its attempts grow by as many)."""
    before = upstream_state(gw, upstream)["counters"]["requests_total"]
    with requests.Session() as session:
        for _ in range(count):
            reply = session.post(f"http://{gw.url()}/v2/models/simple/infer", json=SIMPLE_INFER_REQUEST,
                                 headers={"x-upstream": upstream}, timeout=10)
            assert reply.status_code == 200, reply.text
    assert upstream_state(gw, upstream)["counters"]["requests_total"] >= before + count


def endpoints(gw: GatewayProcess, upstream: str) -> dict[str, Any]:
    return {e["address"]: e for e in upstream_state(gw, upstream)["endpoints"]}


def addresses(backends: Backends, upstream: str, hosts: tuple[str, ...] | list[str]) -> set[str]:
    port = backends.rest_port if upstream == "via-rest" else backends.grpc_port
    return {f"{host}:{port}" for host in hosts}


@pytest.mark.parametrize("upstream", ["via-rest", "via-grpc"])
def test_every_address_of_a_name_serves_and_answers_changes_follow(
        upstream: str, backends: Backends, dns: DnsServer, tmp_path: Path) -> None:
    with front(tmp_path, dns, backends) as gw:
        assert set(endpoints(gw, upstream)) == addresses(backends, upstream, HOSTS)
        before = {host: backends.served(host) for host in HOSTS}
        infer(gw, upstream, 30)
        for host in HOSTS:  # round robin: each server answered its share
            assert backends.served(host) - before[host] >= 5, host

        # A pod goes (127.0.0.2 leaves the answer): it gets no new request.
        dns.answer(list(HOSTS[1:]))
        wait_for(lambda: set(endpoints(gw, upstream)) == addresses(backends, upstream, HOSTS[1:]), WAIT,
                 "the gone address to be drained")
        gone_before = backends.served(HOSTS[0])
        infer(gw, upstream, 12)
        assert backends.served(HOSTS[0]) == gone_before

        # It comes back: it gets traffic again.
        dns.answer(list(HOSTS))
        wait_for(lambda: set(endpoints(gw, upstream)) == addresses(backends, upstream, HOSTS), WAIT,
                 "the new address to be added")
        infer(gw, upstream, 12)
        assert backends.served(HOSTS[0]) > gone_before


def test_an_address_with_no_server_fails_its_health_checks_while_the_others_serve(
        backends: Backends, dns: DnsServer, tmp_path: Path) -> None:
    dead = "127.0.0.9"  # in the answer, nothing listens there
    dns.answer([*HOSTS[:2], dead])
    with front(tmp_path, dns, backends, check=True) as gw:
        for upstream in ("via-rest", "via-grpc"):
            state = endpoints(gw, upstream)
            assert set(state) == addresses(backends, upstream, [*HOSTS[:2], dead])
            assert not state[next(iter(addresses(backends, upstream, [dead])))]["healthy"]
            infer(gw, upstream, 10)
            state = endpoints(gw, upstream)
            assert state[next(iter(addresses(backends, upstream, [dead])))]["counters"]["requests_total"] == 0


def test_without_its_nameserver_the_gateway_keeps_the_last_addresses(
        backends: Backends, dns: DnsServer, tmp_path: Path) -> None:
    with front(tmp_path, dns, backends) as gw:
        dns.stop()
        wait_for(lambda: metric_value(scrape_metrics(gw), "gateway_dns_resolution_failures_total",
                                      upstream="via-grpc") >= 2, WAIT, "failed resolutions to be counted")
        for upstream in ("via-rest", "via-grpc"):
            assert set(endpoints(gw, upstream)) == addresses(backends, upstream, HOSTS)
            before = {host: backends.served(host) for host in HOSTS}
            infer(gw, upstream, 15)
            assert all(backends.served(host) > before[host] for host in HOSTS)
        assert f"resolving {NAME} failed" in gw.log()
        assert upstream_state(gw, "via-rest")["dns"][0]["failures_total"] >= 1


def test_a_name_that_never_resolves_stays_one_endpoint_as_before(tmp_path: Path, dns: DnsServer) -> None:
    config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams:
  - {{name: far, protocol: v2-rest, endpoints: ["nowhere.test:9"],
     dns: {{nameservers: ["127.0.0.1:{dns.port}"], refresh: 200ms, timeout: 500ms}}}}
routes: [{{match: {{model: "*"}}, upstream: far}}]
"""
    with GatewayProcess(write_config(tmp_path, config), tmp_path / "gateway.log") as gw:
        assert list(endpoints(gw, "far")) == ["nowhere.test:9"]
        reply = requests.post(f"http://{gw.url()}/v2/models/simple/infer", json=SIMPLE_INFER_REQUEST, timeout=10)
        assert reply.status_code == 503 and "nowhere" not in reply.text, reply.text  # cannot connect


# --- config ------------------------------------------------------------------


def _upstream(dns: Any) -> Any:
    from support import parse_yaml_config

    text = f"""
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams: [{{name: m, protocol: v2-grpc, endpoints: ["svc.ns.svc.cluster.local:8001"], dns: {json.dumps(dns)}}}]
routes: [{{match: {{model: "*"}}, upstream: m}}]
"""
    return parse_yaml_config(text).upstreams[0]


def test_dns_options_parse() -> None:
    upstream = _upstream({"refresh": "10s", "reconnect": None, "family": "all", "nameservers": ["10.0.0.10:53"]})
    assert (upstream.dns.refresh, upstream.dns.reconnect, upstream.dns.family) == (10.0, None, "all")
    assert upstream.dns.nameservers == (Address("10.0.0.10", 53),)
    assert _upstream({}).dns.reconnect == 60.0 and _upstream({}).dns.discovery


@pytest.mark.parametrize("dns", [{"nameservers": ["kube-dns:53"]}, {"refresh": 0}, {"family": "v5"},
                                 {"refres": "5s"}])
def test_bad_dns_options_are_refused(dns: Any) -> None:
    with pytest.raises(ConfigError):
        _upstream(dns)


# --- the DNS messages ------------------------------------------------------------


def test_a_query_is_encoded_as_rfc_1035_says() -> None:
    assert dnsclient.encode_query(0x1234, "models.test", dnsclient.TYPE_A) == (
        b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" b"\x06models\x04test\x00" b"\x00\x01\x00\x01")
    assert dnsclient.encode_query(7, "a.b.", dnsclient.TYPE_AAAA).endswith(b"\x01a\x01b\x00\x00\x1c\x00\x01")
    with pytest.raises(dnsclient.DnsError):
        dnsclient.encode_name("x" * 64 + ".test")


QUESTION = b"\x06models\x04test\x00\x00\x01\x00\x01"


def _reply(query_id: int, flags: int, answers: list[bytes]) -> bytes:
    return struct.pack("!HHHHHH", query_id, flags, 1, len(answers), 0, 0) + QUESTION + b"".join(answers)


def _record(name: bytes, rtype: int, ttl: int, data: bytes) -> bytes:
    return name + struct.pack("!HHIH", rtype, 1, ttl, len(data)) + data


def test_an_answer_with_a_cname_and_compressed_names_decodes() -> None:
    cname = _record(b"\xc0\x0c", 5, 30, b"\x04pods\xc0\x13")  # models.test -> pods.test (pointer to "test")
    first = _record(b"\x04pods\xc0\x13", dnsclient.TYPE_A, 20, bytes([10, 0, 0, 7]))
    second = _record(b"\xc0\x0c", dnsclient.TYPE_A, 10, bytes([10, 0, 0, 8]))
    found, ttl = dnsclient.decode_answer(_reply(5, 0x8180, [cname, first, second]), 5, dnsclient.TYPE_A)
    assert (found, ttl) == (["10.0.0.7", "10.0.0.8"], 10)
    v6 = _record(b"\xc0\x0c", dnsclient.TYPE_AAAA, 5, bytes(15) + b"\x01")
    assert dnsclient.decode_answer(_reply(5, 0x8180, [v6]), 5, dnsclient.TYPE_AAAA)[0] == ["::1"]
    assert dnsclient.read_name(_reply(5, 0x8180, [cname]), len(_reply(5, 0x8180, [])) + 12) == "pods.test"


@pytest.mark.parametrize(("message", "error"), [
    (_reply(5, 0x8183, []), "no such name"),
    (_reply(5, 0x8182, []), "server failure"),
    (_reply(6, 0x8180, []), "not the reply"),
    (_reply(5, 0x0100, []), "not the reply"),  # a query, not a response
    (b"\x00\x05\x81", "short"),
    (_reply(5, 0x8180, [_record(b"\xc0\x0c", dnsclient.TYPE_A, 1, b"\x0a\x00")]), "bad address record"),
    (_reply(5, 0x8180, [_record(b"\xc0\x0c", dnsclient.TYPE_A, 1, b"\x0a\x00\x00\x01")])[:-2], "truncated"),
    (_reply(5, 0x8180, [b"\xc0"]), "truncated"),
])
def test_bad_answers_are_refused(message: bytes, error: str) -> None:
    with pytest.raises(dnsclient.DnsError, match=error):
        dnsclient.decode_answer(message, 5, dnsclient.TYPE_A)


def test_a_compression_loop_is_refused() -> None:
    looping = b"\x00" * 12 + b"\xc0\x0c"  # a name pointing at itself
    with pytest.raises(dnsclient.DnsError, match="loop"):
        dnsclient.read_name(looping, 12)


# --- the cluster's endpoint set, over fake clients ----------------------------------


class Answers:
    """Stands in for the resolver: what ``models.test`` resolves to now."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *addresses: str) -> None:
        self.addresses: list[str] | None = list(addresses)  # None: the resolution fails
        monkeypatch.setattr(discovery, "resolve", self.resolve)

    async def resolve(self, name: str, port: int, dns: DnsDiscovery) -> list[str]:
        if self.addresses is None:
            raise OSError("no nameserver")
        return sorted(self.addresses)


def discovered(clock: Any = None, **changes: Any) -> tuple[Cluster, FakeFleet, list[Event]]:
    events: list[Event] = []
    counters = Counters()
    counters.subscribe(events.append)
    fleet = FakeFleet()
    config = dataclasses.replace(UpstreamConfig("u", "fake", (Address(NAME, 8000),)), **changes)
    return Cluster(config, None, counters, client_factory=fleet, clock=clock or time.monotonic), fleet, events


def labels(c: Cluster) -> list[str]:
    return sorted(e.address for e in c.endpoints)


async def test_a_gone_address_drains_and_its_client_closes_after_the_last_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    answers = Answers(monkeypatch, "10.0.0.1", "10.0.0.2")
    c, fleet, events = discovered()
    await c.start()
    assert labels(c) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert fleet["u/10.0.0.1:8000"].endpoint == Address("10.0.0.1", 8000, NAME)  # presents the name
    assert not fleet[f"u/{NAME}:8000"].started  # the name itself was replaced before it started
    lease = c.try_acquire()
    assert lease is not None and lease.endpoint.address == "10.0.0.1:8000"
    answers.addresses = ["10.0.0.2", "10.0.0.3"]
    await c.rediscover()
    assert labels(c) == ["10.0.0.2:8000", "10.0.0.3:8000"]
    assert fleet["u/10.0.0.3:8000"].started
    old = fleet["u/10.0.0.1:8000"]
    assert not old.closed  # a request is still in flight on it
    lease.release(None)
    await asyncio.sleep(0)
    assert old.closed
    assert [(e.name, e.endpoint) for e in events if e.name.startswith("endpoint_")][-2:] == [
        ("endpoint_added", "10.0.0.3:8000"), ("endpoint_removed", "10.0.0.1:8000")]
    await c.close()
    assert all(client.closed for client in fleet.made if client.started)


async def test_a_failed_resolution_keeps_the_addresses_and_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = Answers(monkeypatch, "10.0.0.1", "10.0.0.2")
    c, _, events = discovered()
    await c.start()
    answers.addresses = None
    await c.rediscover()
    assert labels(c) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert [e.endpoint for e in events if e.name == "dns_failure"] == [NAME]
    assert c.snapshot()["dns"] == [{"name": NAME, "addresses": ["10.0.0.1", "10.0.0.2"], "failures_total": 1}]
    await c.close()


async def test_a_single_address_is_reconnected_periodically_keeping_its_state(
        monkeypatch: pytest.MonkeyPatch) -> None:
    Answers(monkeypatch, "10.0.0.1")
    now = [1000.0]
    c, _, _ = discovered(clock=lambda: now[0], dns=DnsDiscovery(reconnect=30.0))
    await c.start()
    first = c.endpoints[0]
    first.ejections = 2
    await c.rediscover()
    assert c.endpoints == [first]  # not yet
    now[0] += 31
    await c.rediscover()
    (second,) = c.endpoints
    assert second is not first and second.address == first.address and second.ejections == 2
    assert second.client.started and first.client.closed  # type: ignore[attr-defined]
    await c.close()


async def test_new_addresses_are_health_checked_before_they_take_traffic(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = Answers(monkeypatch, "10.0.0.1")
    made_unready = FakeFleet()

    def factory(upstream: Any, endpoint: Any, services: Any) -> Any:
        client = made_unready(upstream, endpoint, services)
        client.ready = endpoint.host != "10.0.0.2"
        return client

    c, _, _ = discovered(health_check=HealthCheck(interval=60.0))
    c._client_factory = factory
    await c.start()
    answers.addresses = ["10.0.0.1", "10.0.0.2"]
    await c.rediscover()
    state = {e.address: e.healthy for e in c.endpoints}
    assert state == {"10.0.0.1:8000": True, "10.0.0.2:8000": False}
    await c.close()


async def test_consistent_hash_spreads_over_discovered_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = Answers(monkeypatch, "10.0.0.1")
    c, _, _ = discovered(load_balancing=LoadBalancing("consistent_hash", "x-session"))
    await c.start()
    answers.addresses = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    await c.rediscover()
    chosen = set()
    for key in range(60):
        lease = c.try_acquire(f"session-{key}")
        assert lease is not None
        chosen.add(lease.endpoint.address)
        lease.release(None)
    assert chosen == {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
    await c.close()


def test_a_discovered_http_client_presents_the_name() -> None:
    from gateway.runtime.tls import HttpClientTls
    from gateway.transport.http_client.pool import UpstreamHttp

    pool = UpstreamHttp(Address("127.0.0.2", 8000, NAME), HttpClientTls(), "u", max_response=1 << 20)
    assert f"Host: {NAME}:8000\r\n" in pool._fixed_head
    plain = UpstreamHttp(Address("127.0.0.2", 8000), HttpClientTls(), "u", max_response=1 << 20)
    assert "Host: 127.0.0.2:8000\r\n" in plain._fixed_head


def test_tls_to_discovered_addresses_checks_the_name_not_the_ip(dns: DnsServer, tmp_path: Path) -> None:
    """The servers' certificate names only models.test, as a Service's would:
    a client that checked the pod IP would refuse it."""
    import trustme

    ca = trustme.CA()
    server = ca.issue_cert(NAME)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
    server.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    hosts = HOSTS[:2]
    rest_port, grpc_port = common_port(hosts), common_port(hosts)
    servers = []
    tls = "tls: {cert: server.pem, key: server.key}"
    try:
        for host in hosts:
            config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "{host}:{rest_port}", {tls}}}
  - {{name: grpc, protocol: v2-grpc, address: "{host}:{grpc_port}", {tls}}}
upstreams: [{{name: local, protocol: builtin}}]
routes: [{{match: {{model: "*"}}, upstream: local}}]
"""
            servers.append(GatewayProcess(write_config(tmp_path, config, f"{host}.yaml"), tmp_path / f"{host}.log"))
            servers[-1].start()
        dns.answer(list(hosts))
        discovery = f'dns: {{nameservers: ["127.0.0.1:{dns.port}"]}}, tls: {{ca: ca.pem}}'
        config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}]
upstreams:
  - {{name: via-rest, protocol: v2-rest, endpoints: ["{NAME}:{rest_port}"], {discovery}}}
  - {{name: via-grpc, protocol: v2-grpc, endpoints: ["{NAME}:{grpc_port}"], {discovery}}}
routes:
  - {{match: {{headers: {{x-upstream: via-grpc}}}}, upstream: via-grpc}}
  - {{match: {{model: "*"}}, upstream: via-rest}}
"""
        with GatewayProcess(write_config(tmp_path, config, "front.yaml"), tmp_path / "front.log") as gw:
            for upstream in ("via-rest", "via-grpc"):
                infer(gw, upstream, 6)
                state = endpoints(gw, upstream)
                assert all(e["counters"]["requests_total"] >= 3 for e in state.values()), upstream_state(gw, upstream)
                assert len(endpoints(gw, upstream)) == 2
    finally:
        for process in servers:
            process.stop()


async def test_the_system_resolver_answers_without_nameservers() -> None:
    assert await discovery.resolve("localhost", 80, DnsDiscovery(family="v4_only")) == ["127.0.0.1"]
    with pytest.raises((OSError, dnsclient.DnsError)):
        await discovery.resolve("localhost", 80, DnsDiscovery(family="v4_only", nameservers=(Address("127.0.0.1", 9),),
                                                              timeout=0.5))


def test_address_families() -> None:
    both = ["10.0.0.1", "fd00::1"]
    assert discovery._by_family(both, "v4_preferred") == ["10.0.0.1"]
    assert discovery._by_family(["fd00::1"], "v4_preferred") == ["fd00::1"]
    assert discovery._by_family(both, "v6_only") == ["fd00::1"]
    assert discovery._by_family(both, "all") == both
