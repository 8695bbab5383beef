"""Every protocol's error table is complete in both directions, and the
codecs and frontends use it (docs/architecture.md, "Errors").

Downstream: every ErrorKind has the protocol's own form. Upstream: every
form an upstream of the protocol can answer reads as a kind, never one that
names the gateway's own state. A form the table answers, read back from an
upstream, answers the same, except where the table means otherwise
(:data:`NOT_ROUND_TRIPPED`, each with its reason)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import grpc
import orjson
import pytest

from gateway.core.errors import GATEWAY_ONLY_KINDS, ErrorKind, ErrorTable, GatewayError
from gateway.protocols import registry
from gateway.protocols.base import Frontend, UpstreamClient
from gateway.protocols.graphstorm import codec as graphstorm
from gateway.protocols.http_frontend import HttpFrontend
from gateway.protocols.openai import codec as openai
from gateway.protocols.openai import upstream_codec as openai_upstream
from gateway.protocols.umbridge import codec as umbridge
from gateway.protocols.v1_rest import codec as v1_rest
from gateway.protocols.v1_rest import upstream_codec as v1_rest_upstream
from gateway.protocols.v2_grpc import codec as v2_grpc
from gateway.protocols.v2_rest import codec as v2_rest
from support import REPO

PROTOCOLS = registry.names("errors")

# (protocol, kind) whose own form, read back from an upstream, means another
# kind with another form; each is checked to really differ.
NOT_ROUND_TRIPPED = {
    ("v2-rest", ErrorKind.OVERLOADED): "an upstream's 429 is its own limit: UPSTREAM_OVERLOADED (503)",
    ("v2-rest", ErrorKind.UNAUTHENTICATED): "an upstream's 401 refuses the gateway's credential: 502",
    ("v2-rest", ErrorKind.UPSTREAM_BAD_RESPONSE): "an upstream's 502 is a proxy that cannot reach it: 503",
    ("v2-rest", ErrorKind.INTERNAL): "an upstream's 500 is its bug, to the gateway a bad answer: 502",
    ("v1-rest", ErrorKind.OVERLOADED): "an upstream's 429 is its own limit: UPSTREAM_OVERLOADED (503)",
    ("v1-rest", ErrorKind.UNAUTHENTICATED): "an upstream's 401 refuses the gateway's credential: 502",
    ("v1-rest", ErrorKind.UPSTREAM_BAD_RESPONSE): "an upstream's 502 is a proxy that cannot reach it: 503",
    ("v1-rest", ErrorKind.INTERNAL): "an upstream's 500 is its bug, to the gateway a bad answer: 502",
    ("openai", ErrorKind.OVERLOADED): "an upstream's 429 is its own limit: UPSTREAM_OVERLOADED (503)",
    ("openai", ErrorKind.UNAUTHENTICATED): "an upstream's 401 refuses the gateway's API key: 502",
    ("openai", ErrorKind.UPSTREAM_BAD_RESPONSE): "an upstream's 502 is a proxy that cannot reach it: 503",
    ("openai", ErrorKind.INTERNAL): "an upstream's 500 is its bug, to the gateway a bad answer: 502",
    ("umbridge", ErrorKind.OVERLOADED): "an upstream's Overloaded is its own limit: UpstreamOverloaded (503)",
    ("umbridge", ErrorKind.INTERNAL): "an upstream's InternalError is its bug: InvalidOutput",
}

# (protocol, form) whose upstream words are dropped on purpose, each checked to be.
WORDS_DROPPED = {
    ("openai", 401): "servers quote part of a refused API key",
    ("openai", 403): "servers quote part of a refused API key",
}

# How each codec writes a kind and reads an upstream's form, so the test
# sees that they go through the table rather than a copy of it.
ENCODED: dict[str, Callable[[GatewayError], Any]] = {
    "v2-rest": lambda error: v2_rest.encode_error(error)[0],
    "v1-rest": lambda error: v1_rest.encode_error(error)[0],
    "v2-grpc": lambda error: v2_grpc.encode_error(error)[0],
    "umbridge": lambda error: (orjson.loads(umbridge.encode_error(error)[1])["error"]["type"],
                               umbridge.encode_error(error)[0]),
    "graphstorm": lambda error: orjson.loads(graphstorm.encode_error(error, ""))["status_code"],
    "openai": lambda error: openai.encode_error(error)[0],
}
DECODED: dict[str, Callable[[Any], GatewayError]] = {
    "v2-rest": lambda status: v2_rest.decode_error(status, b'{"error": "why"}', "up-7"),
    "v2-grpc": lambda code: v2_grpc.decode_error(code, "why", "up-7"),
    "umbridge": lambda form: umbridge.decode_error(
        form[1], {"error": {"message": "why", **({"type": form[0]} if form[0] else {})}}, "up-7"),
    "graphstorm": lambda code: graphstorm.upstream_error({"status_code": code, "error": "why"}, "up-7"),
    "v1-rest": lambda status: v1_rest_upstream.decode_error(status, b'{"error": "why"}', "up-7"),
    "openai": lambda status: openai_upstream.decode_error(status, b'{"error": {"message": "why"}}', "up-7"),
}


def _table(protocol: str) -> ErrorTable[Any]:
    table = registry.load(protocol, "errors")
    assert isinstance(table, ErrorTable)
    return table


def test_every_wire_protocol_has_a_table() -> None:
    """Every frontend, and every backend that talks to a network peer."""
    backends = {p for p in registry.names("backend") if registry.load(p, "backend").needs_endpoints()}
    assert set(registry.names("frontend")) | backends == set(PROTOCOLS)
    assert set(PROTOCOLS) == set(ENCODED) == set(DECODED)


@pytest.mark.parametrize("protocol", sorted(registry.PROTOCOLS))
def test_a_package_exports_what_it_lists(protocol: str) -> None:
    kinds = {"frontend": Frontend, "backend": UpstreamClient}
    for side, base in kinds.items():
        if registry.offers(protocol, side):
            assert issubclass(registry.load(protocol, side), base)
    with pytest.raises(AttributeError):
        _ = registry._package(protocol).NOT_EXPORTED


@pytest.mark.parametrize("kind", list(ErrorKind), ids=lambda k: k.name)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_kind_has_a_downstream_form(protocol: str, kind: ErrorKind) -> None:
    table = _table(protocol)
    assert kind in table.downstream, f"{protocol} has no error form for {kind.name}"
    assert ENCODED[protocol](GatewayError(kind, "why")) == table.downstream[kind]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_form_an_upstream_answers_reads_as_an_upstream_kind(protocol: str) -> None:
    table = _table(protocol)
    assert table.received
    for form in table.received:
        kind = table.upstream(form)
        assert isinstance(kind, ErrorKind), (protocol, form)
        assert kind not in GATEWAY_ONLY_KINDS, f"{protocol}: an upstream's {form} read as the gateway's {kind.name}"
        decoded = DECODED[protocol](form)
        assert decoded.kind is kind, (protocol, form, decoded)
        assert "up-7" in decoded.message
        assert ("why" not in decoded.message) if (protocol, form) in WORDS_DROPPED else ("why" in decoded.message)


@pytest.mark.parametrize("kind", list(ErrorKind), ids=lambda k: k.name)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_own_form_read_back_answers_the_same(protocol: str, kind: ErrorKind) -> None:
    table = _table(protocol)
    form = table.downstream[kind]
    assert form in table.received, f"{protocol} answers {form}, which its upstream side does not expect"
    again = table.downstream[table.upstream(form)]
    if (protocol, kind) in NOT_ROUND_TRIPPED:
        assert again != form, f"listed as not round-tripped, but it is: {NOT_ROUND_TRIPPED[protocol, kind]}"
    else:
        assert again == form, f"{protocol}: {kind.name} answers {form}; read back, it answers {again}"


def test_grpc_decides_every_code() -> None:
    """gRPC's codes are few: its table lists each one, so none is read by
    the fallback by accident."""
    from gateway.protocols.v2_grpc.errors import KIND_OF_UPSTREAM_CODE

    assert set(KIND_OF_UPSTREAM_CODE) == set(_table("v2-grpc").received)


def test_upstream_overload_decisions() -> None:
    """An upstream's 429 / RESOURCE_EXHAUSTED is its overload; grpc's
    message-size refusal is the request's size."""
    assert _table("v2-rest").upstream(429) is ErrorKind.UPSTREAM_OVERLOADED
    assert _table("v2-grpc").upstream(grpc.StatusCode.RESOURCE_EXHAUSTED) is ErrorKind.UPSTREAM_OVERLOADED
    too_big = v2_grpc.decode_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (9 vs. 4)",
                                   "u")
    assert too_big.kind is ErrorKind.TOO_LARGE


def _http_frontends() -> list[str]:
    return [p for p in registry.names("frontend") if issubclass(registry.load(p, "frontend"), HttpFrontend)]


@pytest.mark.parametrize("protocol", _http_frontends())
def test_an_http_frontends_statuses_read_back_as_its_kinds(protocol: str) -> None:
    """The outcome of an answer no handler noted comes from the frontend's
    own table: every error status it answers is there, and reads as a kind
    it answers with that status."""
    frontend_class = registry.load(protocol, "frontend")
    frontend = object.__new__(frontend_class)  # error_reply needs no listener
    status_of = {kind: frontend.error_reply(GatewayError(kind, "why"), None).status for kind in ErrorKind}
    kinds = frontend_class.status_kinds
    for kind, status in status_of.items():
        if status >= 400:
            assert status in kinds, f"{protocol} answers {kind.name} with {status}, which its table lacks"
            assert status_of[kinds[status]] == status, (protocol, status, kinds[status])


def test_listing_protocols_imports_none() -> None:
    """``gateway check`` stays fast: naming the protocols and loading the
    V2 REST frontend import no grpc."""
    script = ("import sys\nfrom gateway.protocols import registry\n"
              "registry.names('frontend'); registry.names('backend'); registry.framing_headers()\n"
              "registry.load('v2-rest', 'frontend'); registry.load('umbridge', 'errors')\n"
              "assert 'grpc' not in sys.modules, 'grpc imported'\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
