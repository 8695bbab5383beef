"""What the gateway sends upstream, seen by the upstream: the client's gRPC
deadline and the W3C trace context, through the real
V2 REST and V2 gRPC upstream clients.

The gateway runs in its own process; the upstream is the recorder of
``peers/recording_upstream.py`` (real aiohttp and grpc.aio servers that
report the headers, metadata and deadline their handlers received).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from test_tracing import OtlpReceiver
from tritonclient.utils import InferenceServerException

from peers.recording_upstream import DELAY_HEADER, RecordingUpstream
from support import SIMPLE_INFER_REQUEST, GatewayProcess, write_config

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
UPSTREAM_DELAY_MS = 3000


def gateway_config(recorder: RecordingUpstream) -> str:
    return f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: rec-rest, protocol: v2-rest, endpoints: ["{recorder.address('rest')}"]}}
  - {{name: rec-grpc, protocol: v2-grpc, endpoints: ["{recorder.address('grpc')}"]}}
routes:
  - match: {{model: timed, headers: {{x-hop: grpc}}}}
    upstream: rec-grpc
    timeout: 500ms
    forward_headers: [{DELAY_HEADER}]
  - {{match: {{headers: {{x-hop: grpc}}}}, upstream: rec-grpc, forward_headers: [{DELAY_HEADER}]}}
  - {{upstream: rec-rest, forward_headers: [{DELAY_HEADER}]}}
"""


@pytest.fixture(scope="module")
def gateway(recorder: RecordingUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("wire")
    with GatewayProcess(write_config(directory, gateway_config(recorder)), directory / "gateway.log") as gw:
        yield gw


def grpc_infer(gw: GatewayProcess, model: str, headers: dict[str, str], client_timeout: float | None = None) -> None:
    array = np.arange(4, dtype=np.int32)
    item = grpcclient.InferInput("x", [4], "INT32")
    item.set_data_from_numpy(array)
    with grpcclient.InferenceServerClient(gw.url("grpc")) as client:
        client.infer(model, [item], headers=headers, client_timeout=client_timeout)


# --- deadlines ----------------------------------------------------------------------


@pytest.mark.parametrize("hop", ["grpc", "rest"])
def test_grpc_client_deadline_ends_the_call_and_reaches_a_grpc_upstream(
        gateway: GatewayProcess, recorder: RecordingUpstream, hop: str) -> None:
    marker = f"deadline-via-{hop}"
    with pytest.raises(InferenceServerException) as raised:  # the client's own deadline ends its call
        grpc_infer(gateway, "slow", {"x-hop": hop, "x-request-id": marker, DELAY_HEADER: str(UPSTREAM_DELAY_MS)},
                   client_timeout=0.3)
    assert raised.value.status() == "StatusCode.DEADLINE_EXCEEDED", raised.value
    call = recorder.call_with("x-request-id", marker)
    if hop == "grpc":
        # The upstream's grpc deadline is what was left of the client's 0.3 s.
        # (grpc-timeout is sent in whole units and rounded up: allow a little over)
        assert call["time_remaining"] is not None and 0 < call["time_remaining"] <= 0.31, call
    else:
        # V2 REST has no deadline header: nothing deadline-like is sent.
        assert not {"grpc-timeout", "timeout", "x-deadline"} & set(call["headers"]), call["headers"]


def test_route_timeout_is_the_grpc_upstreams_deadline(gateway: GatewayProcess, recorder: RecordingUpstream) -> None:
    """Without a client deadline, the route's 500ms becomes the upstream's."""
    reply = requests.post(f"http://{gateway.url('rest')}/v2/models/timed/infer", json=SIMPLE_INFER_REQUEST,
                          headers={"x-hop": "grpc", "x-request-id": "route-timeout", DELAY_HEADER: "2000"},
                          timeout=10)
    assert reply.status_code == 504, reply.text
    call = recorder.call_with("x-request-id", "route-timeout")
    # (grpc-timeout is sent in whole units and rounded up: allow a little over)
    assert call["time_remaining"] is not None and 0.2 < call["time_remaining"] <= 0.51, call


def test_no_deadline_without_client_deadline_or_timeout(gateway: GatewayProcess, recorder: RecordingUpstream) -> None:
    grpc_infer(gateway, "plain", {"x-hop": "grpc", "x-request-id": "no-deadline"})
    assert recorder.call_with("x-request-id", "no-deadline")["time_remaining"] is None


# --- trace context ----------------------------------------------------------------------


@pytest.mark.parametrize("hop", ["rest", "grpc"])
@pytest.mark.parametrize("client", ["rest", "grpc"])
def test_trace_context_reaches_the_upstream_unchanged(gateway: GatewayProcess, recorder: RecordingUpstream,
                                                      client: str, hop: str) -> None:
    marker = f"trace-{client}-via-{hop}"
    headers = {"x-hop": hop, "x-request-id": marker, "traceparent": TRACEPARENT, "tracestate": TRACESTATE}
    if client == "grpc":
        grpc_infer(gateway, "traced", headers)
    else:
        reply = requests.post(f"http://{gateway.url('rest')}/v2/models/traced/infer", json=SIMPLE_INFER_REQUEST,
                              headers=headers, timeout=10)
        assert reply.status_code == 200, reply.text
    call = recorder.call_with("x-request-id", marker)
    assert call["transport"] == hop
    assert call["headers"]["traceparent"] == TRACEPARENT
    assert call["headers"]["tracestate"] == TRACESTATE


def test_malformed_traceparent_is_not_forwarded(gateway: GatewayProcess, recorder: RecordingUpstream) -> None:
    """W3C: an invalid traceparent is dropped, and its tracestate with it."""
    headers = {"x-hop": "grpc", "x-request-id": "bad-trace", "traceparent": "00-not-a-trace-01",
               "tracestate": TRACESTATE}
    grpc_infer(gateway, "traced", headers)
    call = recorder.call_with("x-request-id", "bad-trace")
    assert "traceparent" not in call["headers"] and "tracestate" not in call["headers"], call["headers"]


@pytest.fixture(scope="module")
def traced_gateway(recorder: RecordingUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """The same gateway with tracing on; its spans go to an OTLP receiver
    (test_tracing's) only so that exporting them never waits on retries."""
    directory = tmp_path_factory.mktemp("wire-traced")
    receiver = OtlpReceiver()
    receiver.thread.start()
    config = gateway_config(recorder) + f"""
observability:
  tracing: {{enabled: true, endpoint: "{receiver.endpoint}"}}
"""
    try:
        with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
            yield gw
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()


@pytest.mark.parametrize("hop", ["rest", "grpc"])
def test_with_tracing_the_upstreams_parent_is_the_gateways_span(traced_gateway: GatewayProcess,
                                                                  recorder: RecordingUpstream, hop: str) -> None:
    marker = f"traced-via-{hop}"
    reply = requests.post(f"http://{traced_gateway.url('rest')}/v2/models/traced/infer", json=SIMPLE_INFER_REQUEST,
                          headers={"x-hop": hop, "x-request-id": marker, "traceparent": TRACEPARENT,
                                   "tracestate": TRACESTATE}, timeout=10)
    assert reply.status_code == 200, reply.text
    gateway_span = reply.headers["traceparent"]
    version, trace, span_id, flags = gateway_span.split("-")
    client_trace, client_span = TRACEPARENT.split("-")[1:3]
    assert (version, trace, flags) == ("00", client_trace, "01") and span_id != client_span
    sent = recorder.call_with("x-request-id", marker)["headers"]
    assert sent["traceparent"] == gateway_span  # same trace, parent = the gateway's span
    assert sent["tracestate"] == TRACESTATE
