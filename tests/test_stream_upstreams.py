"""Streaming upstreams, over real sockets: tritonclient.grpc streams (sync
and aio) -> gateway -> MLServer 1.7's ModelStreamInfer (its own message
form), MLServer's REST ``infer_stream`` (server-sent events), and a second copy
of this gateway's ModelStreamInfer (Triton's form, serving the builtin
decoupled ``repeat_int32``; it stands in for Triton, which does not run
here); errors mid-stream, a cancel that reaches the upstream,
and a slow reader that slows the upstream."""

from __future__ import annotations

import asyncio
import itertools
import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from hypothesis import given
from hypothesis import strategies as st
from stream_client import Stream, final_flag, repeat_inputs

from gateway.transport.http_server.sse import SseError, SseEvent, SseParser, encode_event, parse_events
from peers.echo_gateway import upstream_state
from peers.mlserver import MLServerPeer
from support import GatewayProcess, free_port, metric_value, scrape_metrics, wait_for, write_config

MODEL = "count_stream"  # tests/peers/mlserver_models/count_stream.py
# The front gateway's model names, one per upstream.
VIA_GRPC, VIA_REST, VIA_UNARY = "grpc_count", "rest_count", "unary_simple"
# ... and with `stream_relay: immediate`.
NOW_GRPC, NOW_REST = "grpc_count_now", "rest_count_now"

PEER_CONFIG = """
admin: {address: "127.0.0.1:0"}
listeners:
  - {name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}
upstreams:
  - {name: local, protocol: builtin}
routes:
  - match: {model: "*"}
    upstream: local
"""


@pytest.fixture(scope="module")
def peer_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A second copy of this gateway as a Triton-form ModelStreamInfer server
    (builtin repeat_int32, simple): no Triton server runs here."""
    directory = tmp_path_factory.mktemp("stream-peer")
    with GatewayProcess(write_config(directory, PEER_CONFIG), directory / "gateway.log") as gw:
        yield gw


@pytest.fixture(scope="module")
def gateway(mlserver: MLServerPeer, peer_gateway: GatewayProcess,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("stream-upstreams")
    text = f"""
admin: {{address: "127.0.0.1:0"}}
limits: {{stream_buffer_responses: 2, max_request_bytes: 64MiB}}
listeners:
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
upstreams:
  - {{name: ml-grpc, protocol: v2-grpc, endpoints: ["{mlserver.grpc_address}"]}}
  - {{name: ml-rest, protocol: v2-rest, endpoints: ["{mlserver.rest_address}"], streaming: infer_stream}}
  - {{name: ml-unary, protocol: v2-rest, endpoints: ["{mlserver.rest_address}"]}}
  - {{name: peer, protocol: v2-grpc, endpoints: ["{peer_gateway.url('grpc')}"]}}
  - {{name: ml-grpc-now, protocol: v2-grpc, endpoints: ["{mlserver.grpc_address}"], stream_form: mlserver,
      stream_relay: immediate}}
  - {{name: ml-rest-now, protocol: v2-rest, endpoints: ["{mlserver.rest_address}"], streaming: infer_stream,
      stream_relay: immediate}}
routes:
  - match: {{model: {NOW_GRPC}}}
    upstream: ml-grpc-now
    rewrite: {{model: {MODEL}}}
  - match: {{model: {NOW_REST}}}
    upstream: ml-rest-now
    rewrite: {{model: {MODEL}}}
  - match: {{model: {VIA_GRPC}}}
    upstream: ml-grpc
    rewrite: {{model: {MODEL}}}
  - match: {{model: {VIA_REST}}}
    upstream: ml-rest
    rewrite: {{model: {MODEL}}}
  - match: {{model: {VIA_UNARY}}}
    upstream: ml-unary
    rewrite: {{model: simple}}
  - match: {{model: "*"}}
    upstream: peer
"""
    with GatewayProcess(write_config(directory, text), directory / "gateway.log") as gw:
        yield gw


# --- the SSE parser (gateway/transport/http_server/sse.py) ------------------------------------------------


@pytest.mark.parametrize("data", [b'{"a": 1}', b"", b"two\nlines", b"crlf\r\nand cr\rend", b": not a comment"])
def test_what_the_gateway_writes_it_reads_back(data: bytes) -> None:
    """encode_event (the generate_stream listener) and the parser (streaming
    upstreams) agree; line breaks of any kind come back as LF."""
    events = parse_events(encode_event(data) + encode_event(b"next"), 1024)
    assert [e.data for e in events] == [data.replace(b"\r\n", b"\n").replace(b"\r", b"\n"), b"next"]

SSE_TEXT = (b": a comment\r\ndata: {\"a\": 1}\r\n\r\nevent: error\ndata:first\ndata: second\n\n"
            b"id: 7\rretry: 5\rdata:  two spaces\r\r\n\ndata: unfinished")
SSE_EVENTS = [SseEvent("message", b'{"a": 1}'), SseEvent("error", b"first\nsecond"),
              SseEvent("message", b" two spaces")]


def test_sse_events_with_every_line_ending() -> None:
    assert parse_events(SSE_TEXT, 1000) == SSE_EVENTS
    parser = SseParser(1000)
    parser.feed(SSE_TEXT)
    assert parser.pending  # "data: unfinished" has no blank line after it


@given(st.lists(st.integers(min_value=0, max_value=len(SSE_TEXT)), max_size=12))
def test_sse_events_are_the_same_however_the_stream_is_cut(cuts: list[int]) -> None:
    parser = SseParser(1000)
    bounds = [0, *sorted(cuts), len(SSE_TEXT)]
    got = [event for a, b in itertools.pairwise(bounds) for event in parser.feed(SSE_TEXT[a:b])]
    assert got == SSE_EVENTS


def test_an_sse_event_is_bounded() -> None:
    parser = SseParser(100)
    with pytest.raises(SseError):
        for _ in range(20):
            parser.feed(b"data: " + b"x" * 10 + b"\n")  # lines of one event that never ends
    with pytest.raises(SseError):
        SseParser(100).feed(b"data: " + b"x" * 200)  # one line that never ends


# --- through the gateway --------------------------------------------------------------------


def count_inputs(values: list[int], module: Any = grpcclient) -> list[Any]:
    item = module.InferInput("IN", [len(values)], "INT32")
    item.set_data_from_numpy(np.array(values, dtype=np.int32))
    return [item]


def outs(results: list[Any]) -> list[tuple[int, int]]:
    return [(int(r.as_numpy("OUT").reshape(-1)[0]), int(r.as_numpy("IDX").reshape(-1)[0])) for r in results]


def events(mlserver: MLServerPeer, tag: str) -> list[dict[str, Any]]:
    return [call for call in mlserver.calls(MODEL) if call.get("tag") == tag]


@pytest.mark.parametrize("model", [VIA_GRPC, VIA_REST])
def test_several_responses_per_request(gateway: GatewayProcess, model: str) -> None:
    """One response per element, as the model yields them, the last one
    final (MLServer's streams carry no flag: their end says it, so each
    response waits for the next). A request that asked for the empty final
    response needs no flag: its responses go on at once, then the empty one."""
    stream = Stream(gateway.url("grpc"))
    try:
        stream.client.async_stream_infer(model, count_inputs([7, 8, 9]), request_id="r1")
        stream.client.async_stream_infer(model, count_inputs([4]), request_id="r2",
                                         enable_empty_final_response=True)
        results = [stream.next() for _ in range(5)]
        assert all(error is None for _, error in results), [e for _, e in results]
        by_id: dict[str, list[Any]] = {}
        for result, _ in results:
            by_id.setdefault(result.get_response().id, []).append(result)
        assert outs(by_id["r1"]) == [(7, 0), (8, 1), (9, 2)]
        assert [final_flag(r) for r in by_id["r1"]] == [False, False, True]
        assert by_id["r1"][0].get_response().model_name == model
        assert outs(by_id["r2"][:1]) == [(4, 0)]
        assert [final_flag(r) for r in by_id["r2"]] == [False, True]
        assert not by_id["r2"][1].get_response().outputs  # the empty final response
        with pytest.raises(queue.Empty):
            stream.next(timeout=0.5)
    finally:
        stream.close()


@pytest.mark.parametrize("model", [NOW_GRPC, NOW_REST, VIA_GRPC, VIA_REST])
def test_immediate_relay(gateway: GatewayProcess, mlserver: MLServerPeer, model: str) -> None:
    """``stream_relay: immediate``, or any request that asked for the empty
    final response: a response goes on before the model has made the next
    (it waits 1 s first); none is final, and the stream's end comes as the
    empty final response the client asked for."""
    tag = f"now-{model}"
    stream = Stream(gateway.url("grpc"))
    try:
        stream.client.async_stream_infer(model, count_inputs([1, 2]), request_id=tag,
                                         parameters={"delay_ms": 1000, "tag": tag},
                                         enable_empty_final_response=True)
        first, error = stream.next()
        assert error is None and outs([first]) == [(1, 0)]
        # The model logs a response as sent once it resumes after yielding it: index 1 is a second away.
        assert 1 not in [e["index"] for e in events(mlserver, tag) if e["event"] == "sent"]
        results = [stream.next() for _ in range(2)]
        assert all(error is None for _, error in results)
        assert outs([results[0][0]]) == [(2, 1)]
        assert [final_flag(first), final_flag(results[0][0])] == [False, False]
        assert final_flag(results[1][0]) is True and not results[1][0].get_response().outputs
    finally:
        stream.close()


@pytest.mark.parametrize("model", [VIA_GRPC, VIA_REST])
def test_generate_stream_events_are_not_held(gateway: GatewayProcess, mlserver: MLServerPeer, model: str) -> None:
    """A REST generate_stream client learns the end from the reply's end:
    each event goes on as the upstream makes it, whatever stream_relay says
    (the model waits 1 s before its second response)."""
    import requests

    tag = f"sse-{model}"
    body = {"IN": [5, 6], "delay_ms": 1000, "tag": tag}
    with requests.post(f"http://{gateway.url('rest')}/v2/models/{model}/generate_stream", json=body, stream=True,
                       timeout=20) as reply:
        assert reply.status_code == 200, reply.text
        lines = reply.iter_lines()
        first = next(line for line in lines if line)
        assert json.loads(first.removeprefix(b"data: "))["OUT"] == 5
        assert 1 not in [e["index"] for e in events(mlserver, tag) if e["event"] == "sent"]
        rest = [json.loads(line.removeprefix(b"data: ")) for line in lines if line]
    assert [event["OUT"] for event in rest] == [6]


@pytest.mark.parametrize("model", [VIA_GRPC, VIA_REST])
def test_aio_stream(gateway: GatewayProcess, model: str) -> None:
    async def run() -> list[tuple[str, int, bool | None]]:
        async with aioclient.InferenceServerClient(gateway.url("grpc")) as client:
            async def requests() -> Any:
                yield {"model_name": model, "inputs": count_inputs([1, 2], module=aioclient), "request_id": "a"}
                yield {"model_name": model, "inputs": count_inputs([3], module=aioclient), "request_id": "b"}

            got = []
            async for result, error in client.stream_infer(requests()):
                assert error is None
                got.append((result.get_response().id, int(result.as_numpy("OUT").reshape(-1)[0]),
                            final_flag(result)))
                if len(got) == 3:
                    break
            return got

    got = asyncio.run(asyncio.wait_for(run(), 30))
    assert sorted(got) == [("a", 1, False), ("a", 2, True), ("b", 3, True)]


@pytest.mark.parametrize("model", [VIA_GRPC, VIA_REST])
def test_error_mid_stream_ends_the_request_not_the_stream(gateway: GatewayProcess, model: str) -> None:
    stream = Stream(gateway.url("grpc"))
    try:
        stream.client.async_stream_infer(model, count_inputs([5, -1, 6]), request_id="bad")
        first, error = stream.next()
        assert error is None and outs([first]) == [(5, 0)]
        result, error = stream.next()
        assert error is not None
        if model == VIA_GRPC:  # MLServer's status and words come through
            assert "element 1 is negative" in str(error)
        else:  # an SSE reply cut short: MLServer closes the connection
            assert "rest" in str(error) and "127.0.0.1" not in str(error)
        stream.client.async_stream_infer(model, count_inputs([3]), request_id="after")
        result, error = stream.next()
        assert error is None and result.get_response().id == "after"
    finally:
        stream.close()


def test_unary_rest_upstream_answers_once_final(gateway: GatewayProcess) -> None:
    """``streaming: unary`` (the default): one /infer call, one final response."""
    stream = Stream(gateway.url("grpc"))
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            item = grpcclient.InferInput(name, [1, 16], "INT32")
            item.set_data_from_numpy(a)
            inputs.append(item)
        stream.client.async_stream_infer(VIA_UNARY, inputs, request_id="u", enable_empty_final_response=True)
        result, error = stream.next()
        assert error is None and final_flag(result) is True
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)
        with pytest.raises(queue.Empty):
            stream.next(timeout=0.5)
    finally:
        stream.close()


def test_triton_form_peer(gateway: GatewayProcess, peer_gateway: GatewayProcess) -> None:
    """A second copy of this gateway (standing in for Triton) speaks
    Triton's form on ModelStreamInfer: the decoupled model's responses come
    through unflagged, then the empty final one the client asked of this
    gateway; a unary model's one response keeps the peer's final flag; the
    peer's error comes back as the request's error."""
    stream = Stream(gateway.url("grpc"))
    try:
        stream.client.async_stream_infer("repeat_int32", repeat_inputs([7, 8, 9], delay_ms=20), request_id="rep",
                                         enable_empty_final_response=True)
        results = [stream.next() for _ in range(4)]
        assert all(error is None for _, error in results)
        data, last = [r for r, _ in results[:3]], results[3][0]
        assert outs(data) == [(7, 0), (8, 1), (9, 2)]
        assert [final_flag(r) for r in data] == [False, False, False]
        assert final_flag(last) is True and not last.get_response().outputs
        assert last.get_response().id == "rep"

        a = np.ones((1, 16), dtype=np.int32)
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            item = grpcclient.InferInput(name, [1, 16], "INT32")
            item.set_data_from_numpy(a)
            inputs.append(item)
        stream.client.async_stream_infer("simple", inputs, request_id="s", enable_empty_final_response=True)
        result, error = stream.next()
        assert error is None and final_flag(result) is True and result.get_response().id == "s"
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)

        stream.client.async_stream_infer("repeat_int32", repeat_inputs([1])[:1], request_id="wrong")
        result, error = stream.next()
        assert error is not None and "DELAY" in str(error), error
        with pytest.raises(queue.Empty):
            stream.next(timeout=0.5)
    finally:
        stream.close()
    log = gateway.log()
    assert "ModelStreamInfer in triton's form" in log and "ModelStreamInfer in mlserver's form" in log


@pytest.mark.parametrize("model", [VIA_GRPC, VIA_REST])
def test_cancel_mid_stream_reaches_the_upstream(gateway: GatewayProcess, mlserver: MLServerPeer,
                                                model: str) -> None:
    tag = f"cancel-{model}"
    stream = Stream(gateway.url("grpc"))
    try:
        stream.client.async_stream_infer(model, count_inputs(list(range(100))), request_id=tag,
                                         parameters={"delay_ms": 50, "tag": tag})
        for _ in range(2):
            _, error = stream.next()
            assert error is None
    finally:
        stream.close(cancel=True)
    ended = wait_for(lambda: [e for e in events(mlserver, tag) if e["event"] == "ended"], 15,
                     "the upstream's stream to end")
    assert ended[0]["how"] == "cancelled"
    sent = [e for e in events(mlserver, tag) if e["event"] == "sent"]
    assert 2 <= len(sent) < 100


def test_cancel_reaches_a_triton_form_peer(gateway: GatewayProcess, peer_gateway: GatewayProcess) -> None:
    """The peer is a second copy of this gateway (standing in for Triton): its metrics show the cancel."""
    def cancelled() -> float:
        return metric_value(scrape_metrics(peer_gateway), "gateway_requests_total", operation="stream_infer",
                            outcome="cancelled")

    before = cancelled()
    stream = Stream(gateway.url("grpc"))
    try:
        stream.client.async_stream_infer("repeat_int32", repeat_inputs(list(range(20)), delay_ms=300),
                                         request_id="long")
        _, error = stream.next()
        assert error is None
    finally:
        stream.close(cancel=True)
    wait_for(lambda: cancelled() == before + 1, 10, "the peer's request to be cancelled")


@pytest.mark.parametrize("model", [VIA_GRPC, VIA_REST])
def test_slow_reader_slows_the_upstream(gateway: GatewayProcess, mlserver: MLServerPeer, model: str) -> None:
    """Responses of 1 MiB: while the client's reader is stuck, the model
    soon stops producing (buffers are bounded all the way); released, the
    rest arrives."""
    tag = f"slow-{model}"
    # Enough responses that the bounded buffers on the way (the stream's
    # outbox, HTTP/2 windows, loopback socket buffers the kernel grows to a
    # few MiB under load) hold well under half of them.
    count = 80
    hold = threading.Event()
    stream = Stream(gateway.url("grpc"), hold=hold)
    try:
        stream.client.async_stream_infer(model, count_inputs(list(range(count))), request_id=tag,
                                         parameters={"delay_ms": 0, "tag": tag, "pad_elements": 1 << 18})
        produced = [-1]

        def settled() -> bool:
            time.sleep(1.0)
            produced.append(len([e for e in events(mlserver, tag) if e["event"] == "sent"]))
            return produced[-1] == produced[-2]

        wait_for(settled, 30, "the upstream to stop producing for a reader that reads nothing")
        assert 0 < produced[-1] < count / 2, produced
        hold.set()
        stream.hold = None
        got = [stream.next(30) for _ in range(count)]
        assert all(error is None for _, error in got)
        assert [i for _, i in outs([r for r, _ in got])] == list(range(count))
    finally:
        hold.set()
        stream.close()


def test_gateway_logs_are_clean(gateway: GatewayProcess, peer_gateway: GatewayProcess) -> None:
    assert "Traceback" not in gateway.log()
    assert "Traceback" not in peer_gateway.log()


# --- retries: only before the first response ---------------------------------------------


def test_a_stream_request_is_retried_only_before_its_first_response(tmp_path: Path) -> None:
    """The upstream's live endpoints are two more copies of this gateway
    (PEER_CONFIG: ModelStreamInfer in Triton's form, builtin repeat_int32),
    standing in for Triton, which does not run here; its first endpoint
    refuses connections. A request whose attempt fails before any response
    is retried on another endpoint; one whose endpoint dies after the first
    response ends with an error (the client holds part of the answer)."""
    peers = [GatewayProcess(write_config(tmp_path, PEER_CONFIG, f"peer{i}.yaml"), tmp_path / f"peer{i}.log")
             for i in range(2)]
    try:
        for peer in peers:
            peer.start()
        front_config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}]
upstreams:
  - name: peers
    protocol: v2-grpc
    endpoints: ["127.0.0.1:{free_port()}", "{peers[0].url('grpc')}", "{peers[1].url('grpc')}"]
    outlier_detection: {{consecutive_failures: 0}}  # the refusing endpoint stays in the rotation
routes:
  - match: {{model: "*"}}
    upstream: peers
    retry: {{attempts: 3, retry_on: [connect-failure, reset, unavailable], backoff: 5ms}}
"""
        with GatewayProcess(write_config(tmp_path, front_config), tmp_path / "gateway.log") as front, \
                Stream(front.url("grpc")) as stream:
            for n in range(6):  # round robin: some start on the refusing endpoint
                stream.client.async_stream_infer("repeat_int32", repeat_inputs([n, n + 1]), request_id=f"r{n}")
                results = [stream.next() for _ in range(2)]
                assert all(error is None for _, error in results), results
                assert outs([r for r, _ in results]) == [(n, 0), (n + 1, 1)]
            assert metric_value(scrape_metrics(front), "gateway_upstream_retries_total", upstream="peers") >= 1

            stream.client.async_stream_infer("repeat_int32", repeat_inputs(list(range(10)), delay_ms=300),
                                             request_id="long")
            first, error = stream.next()
            assert error is None and outs([first]) == [(0, 0)]
            retried = metric_value(scrape_metrics(front), "gateway_upstream_retries_total", upstream="peers")
            serving = [i for i, e in enumerate(upstream_state(front, "peers")["endpoints"][1:]) if e["in_flight"]]
            assert len(serving) == 1, serving
            assert peers[serving[0]].proc is not None
            peers[serving[0]].proc.kill()  # dies mid-stream, connections and all
            result, error = stream.next()
            assert error is not None, outs([result])  # a retry would have started the answer over
            assert metric_value(scrape_metrics(front), "gateway_upstream_retries_total", upstream="peers") == retried
    finally:
        for peer in peers:
            peer.stop()
