"""Metrics, access-log lines, request ids and config redaction, without sockets."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gateway.app.configure import parse_config
from gateway.app.server import build_metrics
from gateway.config.observability import AccessLogConfig
from gateway.config.view import REDACTED, effective_config
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.record import RequestRecord, accept_request_id, accept_traceparent, accept_tracestate
from gateway.core.types import InferRequest, RequestContext
from gateway.dataplane.plane import DataPlane
from gateway.observability.accesslog import AccessLog, _ms, _ms_text, _plain
from gateway.observability.metrics import OTHER_MODEL, UNKNOWN_MODEL, GatewayMetrics
from gateway.protocols import registry
from gateway.runtime.services import GatewayServices

VALID_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def samples(metrics: GatewayMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    body, _ = metrics.render()
    found = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def value(metrics: GatewayMetrics, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for k, v in samples(metrics, name).items() if wanted <= set(k))


def finished(operation: str = "infer", model: str = "m", outcome: str = "ok", status: str = "200") -> RequestRecord:
    return RequestRecord(operation=operation, model=model, route="0", upstream="up", status=status,
                         outcome=outcome, request_bytes=100, response_bytes=2000, decode_seconds=1e-5)


# --- request ids and trace context -------------------------------------------


def test_request_id_kept_when_safe_else_generated() -> None:
    assert accept_request_id("abc-123_x.y") == "abc-123_x.y"
    for hostile in ("", None, "has space", "line\nbreak", "trailing\n", "x" * 129, "caf\u00e9"):
        generated = accept_request_id(hostile)
        assert generated != hostile and len(generated) == 32 and int(generated, 16) >= 0


def test_traceparent_validation() -> None:
    assert accept_traceparent(VALID_TRACEPARENT) == VALID_TRACEPARENT
    for bad in ("", "garbage", VALID_TRACEPARENT.upper(), VALID_TRACEPARENT + "-extra",
                "ff" + VALID_TRACEPARENT[2:], "00-" + "0" * 32 + "-b7ad6b7169203331-01",
                "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01"):
        assert accept_traceparent(bad) == "", bad
    # a later version may append fields; we pass it on unchanged
    future = "01" + VALID_TRACEPARENT[2:] + "-what-comes"
    assert accept_traceparent(future) == future
    assert accept_tracestate("congo=t61rcWkgMzE", VALID_TRACEPARENT) == "congo=t61rcWkgMzE"
    assert accept_tracestate("congo=t61rcWkgMzE", "") == ""  # never without a traceparent
    assert accept_tracestate("a=\n", VALID_TRACEPARENT) == ""


def test_upstream_headers_carry_id_and_trace_context() -> None:
    ctx = RequestContext("rest", "v2-rest", request_id="rid-1", traceparent=VALID_TRACEPARENT, tracestate="a=b")
    assert ctx.upstream_headers() == {"x-request-id": "rid-1", "traceparent": VALID_TRACEPARENT, "tracestate": "a=b"}
    assert RequestContext("rest", "v2-rest", request_id="rid-2").upstream_headers() == {"x-request-id": "rid-2"}


# --- metrics ------------------------------------------------------------------


def test_request_counted_once_with_its_labels() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    metrics.observe_request("rest", "v2-rest", finished(), 0.00042)
    metrics.observe_request("rest", "v2-rest", finished(), 0.0009)
    metrics.observe_request("rest", "v2-rest", finished(outcome="invalid_input", status="400"), 0.0001)
    ok = value(metrics, "gateway_requests_total", listener="rest", protocol="v2-rest", operation="infer",
               model="m", route="0", upstream="up", http_code="200", grpc_code="", outcome="ok")
    assert ok == 2
    assert value(metrics, "gateway_requests_total", http_code="400", outcome="invalid_input") == 1
    metrics.observe_request("grpc", "v2-grpc", finished(outcome="invalid_input", status="INVALID_ARGUMENT"), 0.0001)
    assert value(metrics, "gateway_requests_total", http_code="", grpc_code="INVALID_ARGUMENT") == 1
    # sub-millisecond latencies land in distinct buckets
    assert value(metrics, "gateway_request_duration_seconds_bucket", listener="rest", le="0.0005") == 2
    assert value(metrics, "gateway_request_duration_seconds_bucket", listener="rest", le="0.0002") == 1
    assert value(metrics, "gateway_request_duration_seconds_bucket", listener="rest", le="0.001") == 3
    assert value(metrics, "gateway_response_size_bytes_sum", listener="rest") == 6000
    assert value(metrics, "gateway_translation_duration_seconds_count", side="frontend", stage="decode",
                 protocol="v2-rest") == 3


def test_model_label_cardinality_is_capped() -> None:
    metrics = GatewayMetrics(CollectorRegistry(), max_model_labels=3, known_models=["routed"])
    for i in range(10):
        metrics.observe_request("rest", "v2-rest", finished(model=f"m{i}"), 0.001)
    for i in range(50):  # names that do not exist never use up the cap
        metrics.observe_request("rest", "v2-rest", finished(model=f"typo{i}", outcome="model_not_found"), 0.001)
    metrics.observe_request("rest", "v2-rest", finished(model="routed"), 0.001)
    models = {dict(k)["model"] for k in samples(metrics, "gateway_requests_total")}
    assert models == {"routed", "m0", "m1", OTHER_MODEL, UNKNOWN_MODEL}
    assert value(metrics, "gateway_requests_total", model=OTHER_MODEL) == 8
    assert value(metrics, "gateway_requests_total", model=UNKNOWN_MODEL) == 50


async def test_upstream_call_outcomes_and_timeouts() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    metrics.declare_upstream("up", ["10.0.0.1:80"])
    record = RequestRecord(operation="infer")
    with metrics.upstream_call(record, "up", "10.0.0.1:80"):
        await asyncio.sleep(0)
    with pytest.raises(GatewayError), metrics.upstream_call(record, "up", "10.0.0.1:80"):
        raise GatewayError(ErrorKind.UPSTREAM_UNAVAILABLE, "down")
    with pytest.raises(TimeoutError), metrics.upstream_call(record, "up", "10.0.0.1:80"):
        async with asyncio.timeout(0.001):
            await asyncio.sleep(1)
    assert record.upstream_attempts == 3 and record.upstream == "up" and record.endpoint == "10.0.0.1:80"
    assert record.upstream_seconds >= 0.001
    for outcome in ("ok", "upstream_unavailable", "upstream_timeout"):
        assert value(metrics, "gateway_upstream_requests_total", upstream="up", outcome=outcome) == 1
    assert value(metrics, "gateway_upstream_timeouts_total", upstream="up") == 1
    assert value(metrics, "gateway_upstream_request_duration_seconds_count", operation="infer") == 3
    assert value(metrics, "gateway_upstream_requests_in_flight", upstream="up") == 0


def test_resilience_recording_methods() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    metrics.declare_upstream("up", ["a:1", "b:2"])
    assert value(metrics, "gateway_upstream_retries_total", upstream="up") == 0  # exists before any event
    metrics.record_retry("up")
    metrics.record_circuit_breaker_rejection("up")
    metrics.record_ejection("up", "b:2")
    metrics.set_endpoint_health("up", "b:2", False)
    metrics.record_reload(False)
    assert value(metrics, "gateway_upstream_retries_total", upstream="up") == 1
    assert value(metrics, "gateway_circuit_breaker_rejections_total", upstream="up") == 1
    assert value(metrics, "gateway_outlier_ejections_total", endpoint="b:2") == 1
    assert value(metrics, "gateway_endpoint_healthy", endpoint="a:1") == 1
    assert value(metrics, "gateway_endpoint_healthy", endpoint="b:2") == 0
    assert value(metrics, "gateway_config_reloads_total", result="failure") == 1
    assert value(metrics, "gateway_config_last_reload_successful") == 0
    metrics.record_reload(True, now=1234.5)
    assert value(metrics, "gateway_config_last_reload_success_timestamp_seconds") == 1234.5
    assert value(metrics, "gateway_config_last_reload_successful") == 1


def test_registry_is_injected_not_global() -> None:
    from prometheus_client import REGISTRY

    before = set(REGISTRY._names_to_collectors)
    a, b = GatewayMetrics(CollectorRegistry()), GatewayMetrics(CollectorRegistry())  # no duplicate errors
    a.record_retry("x")
    assert value(b, "gateway_upstream_retries_total") == 0
    assert set(REGISTRY._names_to_collectors) == before


def test_multiprocess_mode_needs_the_environment_first() -> None:
    with pytest.raises(RuntimeError, match="PROMETHEUS_MULTIPROC_DIR"):
        GatewayMetrics(CollectorRegistry(), multiprocess_dir="/tmp")


ROUTED_CONFIG = {
    "listeners": [{"name": "rest", "protocol": "v2-rest", "address": "127.0.0.1:0"}],
    "upstreams": [{"name": "local", "protocol": "builtin"}],
    "routes": [{"match": {"model": "simple"}, "upstream": "local", "timeout": "1ms"},
               {"match": {"model": "*"}, "upstream": "local"}],
}


async def test_dataplane_fills_the_record_and_counts_timeouts() -> None:
    config = parse_config(ROUTED_CONFIG)
    metrics = build_metrics(config, "test")
    services = GatewayServices(config, config.server, metrics=metrics)
    dataplane = DataPlane(config, services, backends=registry.backend)
    client = dataplane.clusters["local"].clients[0]

    async def slow(request: InferRequest, ctx: RequestContext) -> None:
        await asyncio.sleep(1)

    client.infer = slow  # type: ignore[method-assign]  # an upstream that never answers in time
    ctx = RequestContext("rest", "v2-rest", request_id="r")
    with pytest.raises(GatewayError) as info:
        await dataplane.infer(InferRequest("simple"), ctx)
    assert info.value.kind is ErrorKind.UPSTREAM_TIMEOUT
    assert (ctx.record.model, ctx.record.route, ctx.record.upstream) == ("simple", "route-0", "local")
    assert ctx.record.upstream_attempts == 1
    assert value(metrics, "gateway_upstream_timeouts_total", upstream="local") == 1
    assert value(metrics, "gateway_upstream_requests_total", outcome="upstream_timeout") == 1


# --- access log ---------------------------------------------------------------


def _logged(fmt: str, tmp_path: os.PathLike[str], ctx: RequestContext) -> str:
    path = os.path.join(tmp_path, f"access.{fmt}")
    access_log = AccessLog.open(AccessLogConfig(True, fmt, path), worker=3)
    access_log.write(ctx, 0.0123456)
    access_log.close()
    with open(path) as f:
        return f.read()


def _ctx() -> RequestContext:
    ctx = RequestContext("rest", "v2-rest", request_id="rid-7", traceparent=VALID_TRACEPARENT)
    ctx.record = RequestRecord(operation="infer", model='evil"\nts=forged model', route="1", upstream="up",
                               endpoint="127.0.0.1:9", status="200", outcome="ok", method="POST",
                               path="/v2/models/x/infer", request_bytes=10, response_bytes=20,
                               upstream_seconds=0.01, upstream_attempts=2)
    return ctx


def test_json_access_log_line(tmp_path: os.PathLike[str]) -> None:
    text = _logged("json", tmp_path, _ctx())
    assert text.count("\n") == 1
    line = orjson.loads(text)
    assert line["request_id"] == "rid-7" and line["trace_id"] == VALID_TRACEPARENT[3:35]
    assert (line["listener"], line["route"], line["upstream"], line["endpoint"]) == ("rest", "1", "up", "127.0.0.1:9")
    assert (line["status"], line["outcome"], line["attempts"], line["worker"]) == ("200", "ok", 2, 3)
    assert line["duration_ms"] == 12.346 and line["upstream_ms"] == 10.0
    assert (line["request_bytes"], line["response_bytes"]) == (10, 20)
    assert line["model"] == 'evil"\nts=forged model'


def test_plain_access_log_line_cannot_be_forged(tmp_path: os.PathLike[str]) -> None:
    text = _logged("plain", tmp_path, _ctx())
    assert text.count("\n") == 1 and not text.endswith(" \n")  # the newline in the model name stays escaped
    assert "request_id=rid-7 " in text and "status=200 " in text and "endpoint=127.0.0.1:9 " in text
    assert 'model="evil\\"\\nts=forged model"' in text


@pytest.mark.parametrize("worker", [None, 0, 3])
def test_plain_line_in_one_step_is_the_general_format(worker: int | None) -> None:
    """The usual line is formatted without the field dictionary; any line
    must read exactly as the field-by-field format writes it."""
    texts = ["", "simple", "route-0", "127.0.0.1:9", "/v2/models/x/infer", 'evil"\nts=forged', "a b", "x\u2028y",
             "m\udcff", "é", "=", "-", "p" * 400]
    access_log = AccessLog(None, "plain", worker)
    for i, text in enumerate(texts * 3):
        ctx = RequestContext("rest", "v2-rest", request_id=texts[i % 5] or "rid",
                             traceparent=VALID_TRACEPARENT if i % 2 else "")
        ctx.record = RequestRecord(operation="infer", model=text, version=texts[(i + 1) % len(texts)],
                                   route=texts[i % 3], upstream="up", endpoint=texts[(i + 2) % len(texts)],
                                   status="200" if i % 7 else 200, outcome="ok", method="POST",  # type: ignore[arg-type]
                                   path=texts[i % len(texts)], passthrough=texts[i % 2], batch_id=texts[i % 4],
                                   error=texts[(i + 3) % len(texts)], request_bytes=i, response_bytes=20,
                                   upstream_seconds=i / 7, upstream_attempts=i % 3, decode_seconds=0.0,
                                   encode_seconds=1e-7 * i)
        now = 1764880000.0 + i / 3
        assert access_log._plain_line(ctx, i / 11, now) == _plain(access_log.fields(ctx, i / 11, now))


def test_milliseconds_text_is_the_rounded_float_as_python_writes_it() -> None:
    import math
    import random

    rng = random.Random(7)
    values = [0.0, -0.0, 1e-7, 5e-7, 0.0005, 0.0015, -0.0004, 0.0123456, 1e9, 1e13, 1e20, math.inf, -math.inf,
              math.nan, *(k / 1e6 for k in range(2000)), *((k + 0.5) / 1e6 for k in range(2000)),
              *(rng.random() * 10 ** rng.randint(-9, 9) for _ in range(20000))]
    for seconds in values:
        assert _ms_text(seconds) == str(_ms(seconds)), seconds


def test_disabled_access_log_writes_nothing() -> None:
    access_log = AccessLog.open(AccessLogConfig(enabled=False))
    assert not access_log.enabled
    access_log.write(_ctx(), 0.1)


# --- /config redaction ----------------------------------------------------------


def test_effective_config_redacts_secrets() -> None:
    config = parse_config({
        **ROUTED_CONFIG,
        "routes": [{"match": {"model": "m", "headers": {"authorization": "Bearer s3cr3t", "x-tenant": "a"}},
                    "upstream": "local"}],
    })
    shown = effective_config(config)
    text = orjson.dumps(shown).decode()
    assert "s3cr3t" not in text
    assert shown["routes"][0]["match"]["headers"] == {"authorization": REDACTED, "x-tenant": "a"}
    assert shown["listeners"][0]["address"] == "127.0.0.1:0"
    assert shown["limits"]["max_request_bytes"] == 64 << 20


def test_redaction_covers_tls_keys_tokens_and_unknown_objects() -> None:
    from gateway.config.view import _plain

    class Opaque:
        password = "hunter2"

    shown = _plain({"tls": {"cert": "/etc/tls/cert.pem", "key": "/etc/tls/key.pem"},
                    "auth": {"bearer_token": "abc", "client_secret": "def"}, "api_key": "ghi",
                    "options": Opaque(), "timeout": 1.5})
    assert shown == {"tls": {"cert": "/etc/tls/cert.pem", "key": REDACTED}, "auth": REDACTED,
                     "api_key": REDACTED, "options": "<Opaque>", "timeout": 1.5}


def test_a_worker_file_being_created_is_a_torn_read_and_a_scrape_waits_it_out(tmp_path: Path) -> None:
    from prometheus_client import generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    from gateway.observability.metrics import TORN_READ_ERRORS, render_settled

    # A worker that has just opened its file but not sized it yet: a bare scrape fails.
    (tmp_path / "counter_4242.db").write_bytes(b"")
    registry = CollectorRegistry(auto_describe=False)
    MultiProcessCollector(registry, path=str(tmp_path))
    with pytest.raises(TORN_READ_ERRORS):
        generate_latest(registry)

    class Flaky:
        """Torn reads for the first ``torn`` scrapes, then an answer."""

        def __init__(self, torn: int) -> None:
            self.torn, self.calls = torn, 0

        def render(self, accept: str = "") -> tuple[bytes, str]:
            self.calls += 1
            if self.calls <= self.torn:
                generate_latest(registry)  # raises the real error
            return b"ok", "text/plain"

    settles = Flaky(torn=2)
    assert asyncio.run(render_settled(settles)) == (b"ok", "text/plain")  # type: ignore[arg-type]
    assert settles.calls == 3
    never = Flaky(torn=100)
    with pytest.raises(TORN_READ_ERRORS):
        asyncio.run(render_settled(never, attempts=3))  # type: ignore[arg-type]
    assert never.calls == 3
