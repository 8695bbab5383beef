"""DNS discovery of upstream endpoints (issue 19, "Upstreams behind a
Kubernetes Service"), over real sockets.

A tiny DNS server (tests/peers/dns_server.py, its own process, real DNS over
UDP) answers for ``models.test`` from a file each test rewrites; V2 servers
(gateway processes serving the builtin models) listen on 127.0.0.2,
127.0.0.3, ... at one port, like the pods behind a headless Service; the
gateway under test is pointed at that nameserver through ``dns.nameservers``
and balances over what the name resolves to, for a REST and a gRPC upstream.
The DNS message code has unit tests at the end.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gateway import dnsclient
from gateway.config import Address
from gateway.confignode import ConfigError
from peers.echo_gateway import upstream_state
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
  - match: {{headers: {{x-upstream: grpc}}}}
    upstream: via-grpc
    retry: {{attempts: 3, retry_on: [connect-failure, reset], backoff: 5ms}}
  - match: {{model: "*"}}
    upstream: via-rest
    retry: {{attempts: 3, retry_on: [connect-failure, reset], backoff: 5ms}}
"""
    return GatewayProcess(write_config(directory, config, "front.yaml"), directory / "front.log")


def infer(gw: GatewayProcess, upstream: str, count: int) -> None:
    with requests.Session() as session:
        for _ in range(count):
            reply = session.post(f"http://{gw.url()}/v2/models/simple/infer", json=SIMPLE_INFER_REQUEST,
                                 headers={"x-upstream": upstream}, timeout=10)
            assert reply.status_code == 200, reply.text


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
        assert reply.status_code in (502, 503) and "nowhere" not in reply.text


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
