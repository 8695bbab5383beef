"""A ModelStreamInfer client that sends big requests, reads nothing and
vanishes gives back everything its stream held of the memory budget: the
responses queued for it, those still being delivered when it left, and the
requests in flight; their buffers are freed when it leaves, not when the
cyclic garbage collector gets to them (RSS does not grow per client). The
gateway runs in its own process; while the clients attack, a health probe
on the REST listener keeps being answered; after them, the budget is whole
again and a big request fits. A vanished client is one INFO line in the
log, never an ERROR with a traceback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest

from gateway.protocols.v2_grpc import messages as pb
from peers.stall_attack import HealthProber, rss_bytes
from support import GatewayProcess, metric_value, scrape_metrics, wait_for, write_config

MESSAGE = 4 << 20  # bytes of one request's tensor
REQUESTS = 16  # sent on each stream, more than it may have in flight and buffered
CLIENTS = 6  # vanished one after the other: what a leak keeps adds up past the budget
# Each vanished stream left ~30 MiB of buffers that only the cyclic garbage
# collector could free (cancelled tasks kept their tracebacks): RSS grew by
# ~155 MiB over the five clients after the first. Freed at once: ~25 MiB.
RSS_GROWTH_BOUND = 80 << 20
BUDGET = 48 << 20  # room for one whole stream (~44 MiB: its requests in flight, buffer, deliveries)
PROBE_BOUND = 1.0  # seconds: the health probe on the other listener answers within this

CONFIG = f"""
admin: {{address: "127.0.0.1:0"}}
limits:
  max_request_bytes: 5MiB
  max_inflight_bytes: {BUDGET}
  max_stream_requests: 4
  stream_buffer_responses: 2
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin}}
routes:
  - match: {{model: "*"}}
    upstream: local
"""
STREAM_METHOD = f"/{pb.SERVICE}/ModelStreamInfer"
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 2 * MESSAGE)]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("stream-budget")
    with GatewayProcess(write_config(directory, CONFIG), directory / "gateway.log") as gw:
        yield gw


def identity_request(request_id: str, size: int = MESSAGE) -> bytes:
    request = pb.ModelInferRequest(model_name="identity", id=request_id)
    request.inputs.add(name="INPUT0", datatype="UINT8", shape=[size])
    request.raw_input_contents.append(bytes(size))
    return request.SerializeToString()  # type: ignore[no-any-return]


def inflight(gw: GatewayProcess) -> float:
    return metric_value(scrape_metrics(gw), "gateway_inflight_bytes")


def stream_state(gw: GatewayProcess) -> tuple[float, float]:
    samples = scrape_metrics(gw)
    return (metric_value(samples, "gateway_open_streams", listener="grpc"),
            metric_value(samples, "gateway_requests_in_flight", listener="grpc"))


async def vanishing_client(url: str, gw: GatewayProcess) -> None:
    """Sends REQUESTS big requests on one stream, reads no response, and
    cancels the call once the gateway holds all it will hold for it."""
    async with grpc.aio.insecure_channel(url, options=CHANNEL_OPTIONS) as channel:
        call = channel.stream_stream(STREAM_METHOD)(timeout=60)

        async def send() -> None:  # past the stream's limits the gateway stops reading: this blocks
            for index in range(REQUESTS):
                await call.write(identity_request(f"r{index}"))

        sender = asyncio.ensure_future(send())
        held = [-1.0]

        def settled() -> bool:
            held.append(inflight(gw))
            return held[-1] > 0 and held[-1] == held[-2]

        try:
            await asyncio.to_thread(wait_for, settled, 20, "the stream's held bytes to settle", 0.3)
        finally:
            call.cancel()
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)


def test_vanished_stream_clients_give_the_budget_back(gateway: GatewayProcess) -> None:
    assert gateway.proc is not None
    rss = []
    with HealthProber(gateway.ports["rest"], interval=0.05) as probe:
        for _ in range(CLIENTS):
            asyncio.run(vanishing_client(gateway.url("grpc"), gateway))
            wait_for(lambda: stream_state(gateway) == (0.0, 0.0), 15, "the stream and its requests to end")
            rss.append(rss_bytes(gateway.proc.pid))
    assert probe.latencies and probe.failures == 0 and max(probe.latencies) <= PROBE_BOUND, (probe.failures,
                                                                                          probe.figures())
    assert rss[-1] - rss[0] <= RSS_GROWTH_BOUND, [size >> 20 for size in rss]
    wait_for(lambda: inflight(gateway) == 0, 10, "gateway_inflight_bytes to come back to 0")
    log = gateway.log()
    assert "Traceback" not in log and " ERROR " not in log
    assert log.count("ModelStreamInfer stream") == CLIENTS  # one INFO line per vanished client
    # The whole budget is there again: a big unary request and a big stream request are answered.
    with grpc.insecure_channel(gateway.url("grpc"), options=CHANNEL_OPTIONS) as channel:
        reply = channel.unary_unary(pb.method_path("ModelInfer"))(identity_request("after"), timeout=30)
        assert pb.ModelInferResponse.FromString(reply).id == "after"
        call = channel.stream_stream(STREAM_METHOD, response_deserializer=pb.ModelStreamInferResponse.FromString)
        replies = list(call(iter([identity_request("stream-after")]), timeout=30))
    assert [r.error_message for r in replies] == [""]
    assert [r.infer_response.id for r in replies] == ["stream-after"]
    assert len(replies[0].infer_response.raw_output_contents[0]) == MESSAGE
    wait_for(lambda: inflight(gateway) == 0, 10, "gateway_inflight_bytes to come back to 0")


def test_requests_cancelled_while_decoding_give_the_budget_back(gateway: GatewayProcess) -> None:
    """A request whose decoding runs in the offload pool charges what it will
    build from there; when its deadline cancels it first, that late charge
    must not outlive it. 300 K typed BYTES elements: ~18 MiB charged, a few
    tens of ms of decoding; deadlines from 1 to 80 ms land before, during
    and after the charge."""
    request = pb.ModelInferRequest(model_name="identity", id="typed")
    elements = 300_000
    request.inputs.add(name="INPUT0", datatype="BYTES", shape=[elements]).contents.bytes_contents.extend(
        [b"a"] * elements)
    data = request.SerializeToString()
    with grpc.insecure_channel(gateway.url("grpc"), options=CHANNEL_OPTIONS) as channel:
        call = channel.unary_unary(pb.method_path("ModelInfer"))
        for deadline in (0.001, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.08):
            try:
                call(data, timeout=deadline)
            except grpc.RpcError as error:
                assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        wait_for(lambda: stream_state(gateway)[1] == 0.0, 15, "the cancelled requests to end")
        wait_for(lambda: inflight(gateway) == 0, 10, "gateway_inflight_bytes to come back to 0")
        reply = pb.ModelInferResponse.FromString(call(data, timeout=60))
    # Each element raw: a 4-byte length, then its byte.
    assert reply.id == "typed" and len(reply.raw_output_contents[0]) == 5 * elements
    wait_for(lambda: inflight(gateway) == 0, 10, "gateway_inflight_bytes to come back to 0")
