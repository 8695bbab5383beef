"""Dynamic batching's core (gateway/dataplane/batching.py) with a fake upstream, and
through the data plane to a builtin upstream: who joins which batch, what
each member gets back, and what happens on failure, overload and
cancellation. tests/test_batching_gateway.py drives real clients and MLServer."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import yaml

from gateway.app.configure import parse_config
from gateway.config.routes import BatchingConfig
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.types import InferRequest, InferResponse, RawPayload, RequestContext, RequestedOutput, Tensor
from gateway.dataplane.batching import Batcher, Member, batch_key, concatenate, split
from gateway.dataplane.plane import DataPlane
from gateway.protocols import registry
from gateway.runtime.services import GatewayServices

WAIT = 5.0  # bound on every wait below; the batches themselves take milliseconds


def _request(rows: int, start: int = 0, *, dtype: str = "INT32", width: int = 3, name: str = "X",
             outputs: tuple[str, ...] = (), parameters: dict[str, Any] | None = None) -> InferRequest:
    if dtype == "BYTES":
        data = np.array([f"r{start + i}-{j}".encode() for i in range(rows) for j in range(width)],
                        dtype=object).reshape(rows, width)
    else:
        data = (np.arange(rows * width).reshape(rows, width) + start * 100).astype(np.int32 if dtype == "INT32"
                                                                                   else np.float64)
    tensor = Tensor.from_numpy(name, data, dtype)
    return InferRequest("m", inputs=[tensor], outputs=[RequestedOutput(o) for o in outputs],
                        parameters=dict(parameters or {}))


class Upstream:
    """Answers each input X as X_OUT = a transform of its rows; notes each call."""

    def __init__(self, fail: bool = False, delay: float = 0.0, rows_off: int = 0, refuse: int | None = None) -> None:
        self.calls: list[InferRequest] = []
        self.fail, self.delay, self.rows_off = fail, delay, rows_off
        self.refuse = refuse  # a value the model refuses as invalid input wherever it is
        self.started = asyncio.Event()

    async def send(self, request: InferRequest, members: list[Member]) -> InferResponse:
        self.calls.append(request)
        self.started.set()
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail:
            raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE, "the model failed")
        if self.refuse is not None and any((t.data == self.refuse).any() for t in request.inputs):
            raise GatewayError(ErrorKind.INVALID_INPUT, f"X holds {self.refuse}")
        outputs = [Tensor.from_numpy(f"{t.name}_OUT", _transform(t.data)[self.rows_off:], t.datatype)
                   for t in request.inputs]
        return InferResponse(request.model_name, outputs=outputs)


def _transform(data: np.ndarray) -> np.ndarray:
    if data.dtype == object:
        return np.array([bytes(x)[::-1] for x in data.reshape(-1)], dtype=object).reshape(data.shape)
    return data * 2 + 1


def _batcher(upstream: Upstream, **options: Any) -> Batcher:
    config = BatchingConfig(**{"max_batch_size": 8, "max_delay_ms": 20.0, **options})
    return Batcher("r", config, upstream.send)


async def _all(*calls: Any) -> list[Any]:
    return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), WAIT)


def _check_own(request: InferRequest, response: Any) -> None:
    assert isinstance(response, InferResponse), response
    (tensor,) = request.inputs
    (out,) = response.outputs
    assert out.name == f"{tensor.name}_OUT" and out.shape == tensor.shape
    np.testing.assert_array_equal(out.data, _transform(tensor.data))


def test_keys_agree_only_on_what_can_share_a_batch() -> None:
    base = batch_key(_request(1))
    assert base is not None and base[0] == 1
    assert batch_key(_request(2))[1] == base[1]  # type: ignore[index]  # rows may differ
    for other in (_request(1, width=4), _request(1, dtype="FP64"), _request(1, name="Y"),
                  _request(1, outputs=("X_OUT",)), _request(1, parameters={"p": 1})):
        assert batch_key(other)[1] != base[1]  # type: ignore[index]
    scalar = InferRequest("m", inputs=[Tensor("X", "INT32", (), np.array(3, dtype=np.int32))])
    ragged = InferRequest("m", inputs=[Tensor.from_numpy("A", np.zeros((2, 1), np.int32)),
                                       Tensor.from_numpy("B", np.zeros((3, 1), np.int32))])
    for alone in (scalar, ragged, InferRequest("m"), _request(0)):
        assert batch_key(alone) is None


def test_concatenate_and_split_numbers_and_bytes() -> None:
    for dtype in ("INT32", "BYTES"):
        requests = [_request(1, 0, dtype=dtype), _request(2, 1, dtype=dtype), _request(1, 2, dtype=dtype)]
        (stacked,) = concatenate(requests)
        assert stacked.shape == (4, 3) and stacked.datatype == dtype
        response = InferResponse("m", outputs=[Tensor.from_numpy("X_OUT", _transform(stacked.data), dtype)])
        for request, share in zip(requests, split(response, [1, 2, 1]), strict=True):
            _check_own(request, InferResponse("m", outputs=share))
    with pytest.raises(GatewayError) as caught:
        split(InferResponse("m", outputs=[Tensor.from_numpy("Y", np.zeros((3,), np.int32))]), [1, 1])
    assert caught.value.kind is ErrorKind.UPSTREAM_BAD_RESPONSE and "row-independent" in caught.value.message


async def test_concurrent_requests_share_one_call_and_get_their_own_rows() -> None:
    upstream = Upstream()
    batcher = _batcher(upstream, max_batch_size=32)
    requests = [_request(1 + i % 2, i) for i in range(10)]
    responses = await _all(*(batcher.infer(r, None) for r in requests))
    for request, response in zip(requests, responses, strict=True):
        _check_own(request, response)
    assert [c.inputs[0].shape[0] for c in upstream.calls] == [15]


async def test_mixed_shapes_and_dtypes_go_in_separate_batches() -> None:
    upstream = Upstream()
    batcher = _batcher(upstream)
    requests = [_request(1, i, width=3 + i % 2, dtype=("INT32", "FP64", "BYTES")[i % 3]) for i in range(12)]
    responses = await _all(*(batcher.infer(r, None) for r in requests))
    for request, response in zip(requests, responses, strict=True):
        _check_own(request, response)
    assert len(upstream.calls) == 6  # 2 widths x 3 datatypes
    assert all(len({(t.datatype, t.shape[1:]) for t in c.inputs}) == 1 for c in upstream.calls)


async def test_full_batches_go_at_once_and_big_requests_alone() -> None:
    upstream = Upstream()
    batcher = _batcher(upstream, max_batch_size=4, max_delay_ms=10_000.0, preferred_batch_sizes=(3,))
    loop = asyncio.get_running_loop()
    started = loop.time()
    small = [_request(1, i) for i in range(3)]  # a preferred size: sent without waiting out the delay
    big = _request(5, 9)  # over max_batch_size: alone
    full = [_request(2, 20), _request(2, 21)]  # max_batch_size
    responses = await _all(*(batcher.infer(r, None) for r in [*small, big, *full]))
    for request, response in zip([*small, big, *full], responses, strict=True):
        _check_own(request, response)
    assert loop.time() - started < 5.0
    assert sorted(c.inputs[0].shape[0] for c in upstream.calls) == [3, 4, 5]


async def test_the_delay_sends_what_waits() -> None:
    upstream = Upstream()
    batcher = _batcher(upstream, max_delay_ms=30.0)
    response = await asyncio.wait_for(batcher.infer(_request(1), None), WAIT)
    _check_own(_request(1), response)
    assert len(upstream.calls) == 1


async def test_a_batch_of_one_gets_the_upstream_s_own_answer() -> None:
    """Its own request went up (the client's bytes may be relayed): the
    answer may be bytes only, with no decoded outputs to split."""
    relayed = InferResponse("m", raw=RawPayload("v2-rest", b"{}"))

    async def send(request: InferRequest, members: list[Member]) -> InferResponse:
        assert request is alone
        return relayed

    alone = _request(1)
    batcher = Batcher("r", BatchingConfig(8, 1.0), send)
    assert await asyncio.wait_for(batcher.infer(alone, None), WAIT) is relayed


async def test_a_failed_batch_fails_every_member_saying_so() -> None:
    batcher = _batcher(Upstream(fail=True))
    responses = await _all(*(batcher.infer(_request(1, i), None) for i in range(5)))
    assert all(isinstance(r, GatewayError) and r.kind is ErrorKind.UPSTREAM_BAD_RESPONSE
               and r.message == "the model failed (the whole batch of 5 requests failed)" for r in responses)


async def test_a_member_the_model_refuses_is_refused_alone() -> None:
    upstream = Upstream(refuse=301)  # in member 3's rows only (_request(1, 3): 300, 301, 302)
    batcher = _batcher(upstream)
    requests = [_request(1 + i % 2, i) for i in range(5)]
    responses = await _all(*(batcher.infer(r, None) for r in requests))
    for i, (request, response) in enumerate(zip(requests, responses, strict=True)):
        if i == 3:
            assert isinstance(response, GatewayError) and response.message == "X holds 301", response
        else:
            _check_own(request, response)
    assert [c.inputs[0].shape[0] for c in upstream.calls] == [7, 1, 2, 1, 2, 1]  # the batch, then each alone


async def test_an_answer_that_cannot_be_split_fails_every_member() -> None:
    batcher = _batcher(Upstream(rows_off=1))
    responses = await _all(*(batcher.infer(_request(1, i), None) for i in range(3)))
    assert all(isinstance(r, GatewayError) and "row-independent" in r.message for r in responses)


async def test_past_max_queue_the_overload_error_comes_at_once() -> None:
    upstream = Upstream()
    batcher = _batcher(upstream, max_queue=2, max_delay_ms=50.0)
    waiting = [asyncio.ensure_future(batcher.infer(_request(1, i), None)) for i in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(GatewayError) as caught:
        await asyncio.wait_for(batcher.infer(_request(1, 5), None), 0.5)
    assert caught.value.kind is ErrorKind.OVERLOADED and "max_queue" in caught.value.message
    for request, response in zip([_request(1, 0), _request(1, 1)], await _all(*waiting), strict=True):
        _check_own(request, response)
    assert batcher.queued == 0


async def test_a_member_that_leaves_before_the_send_is_not_sent() -> None:
    upstream = Upstream()
    batcher = _batcher(upstream, max_delay_ms=30.0)
    leaving = asyncio.ensure_future(batcher.infer(_request(2, 0), None))
    staying = asyncio.ensure_future(batcher.infer(_request(1, 1), None))
    await asyncio.sleep(0)
    leaving.cancel()
    (response,) = await _all(staying)
    _check_own(_request(1, 1), response)
    assert [c.inputs[0].shape[0] for c in upstream.calls] == [1]
    assert batcher.queued == 0


async def test_a_member_that_leaves_after_the_send_loses_only_its_share() -> None:
    upstream = Upstream(delay=0.05)
    batcher = _batcher(upstream, max_batch_size=2)
    leaving = asyncio.ensure_future(batcher.infer(_request(1, 0), None))
    staying = asyncio.ensure_future(batcher.infer(_request(1, 1), None))
    await asyncio.wait_for(upstream.started.wait(), WAIT)
    leaving.cancel()
    (response,) = await _all(staying)
    _check_own(_request(1, 1), response)
    assert leaving.cancelled()


async def test_a_batch_nobody_waits_for_is_cancelled() -> None:
    upstream = Upstream(delay=10.0)
    batcher = _batcher(upstream, max_batch_size=2)
    members = [asyncio.ensure_future(batcher.infer(_request(1, i), None)) for i in range(2)]
    await asyncio.wait_for(upstream.started.wait(), WAIT)
    (batch,) = batcher._tasks
    for member in members:
        member.cancel()
    await asyncio.gather(*members, return_exceptions=True)
    await asyncio.wait_for(asyncio.wait([batch]), WAIT)  # not the upstream's 10 s
    assert batch.cancelled()


BUILTIN = """
listeners: [{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}]
upstreams: [{name: local, protocol: builtin}]
routes:
  - match: {model: simple}
    upstream: local
    batching: {max_batch_size: 16, max_delay_ms: 20}
"""


async def test_through_the_data_plane_to_a_builtin_upstream() -> None:
    config = parse_config(yaml.safe_load(BUILTIN))
    plane = DataPlane(config, GatewayServices(config, config.server), backends=registry.backend)
    await plane.start()
    try:
        def simple(i: int, rows: int) -> tuple[InferRequest, RequestContext]:
            a = np.arange(rows * 16, dtype=np.int32).reshape(rows, 16) + i
            request = InferRequest("simple", id=f"req-{i}", inputs=[Tensor.from_numpy("INPUT0", a),
                                                                  Tensor.from_numpy("INPUT1", np.ones_like(a))])
            return request, RequestContext("rest", "v2-rest", request_id=f"req-{i}")

        calls = [simple(i, 1 + i % 2) for i in range(8)]
        responses = await _all(*(plane.infer(r, c) for r, c in calls))
        batch_ids = set()
        for (request, ctx), response in zip(calls, responses, strict=True):
            assert isinstance(response, InferResponse), response
            assert response.id == request.id and response.model_name == "simple"
            out = {t.name: t.data for t in response.outputs}
            np.testing.assert_array_equal(out["OUTPUT0"], request.inputs[0].data + 1)
            np.testing.assert_array_equal(out["OUTPUT1"], request.inputs[0].data - 1)
            assert ctx.record.upstream == "local" and ctx.record.batch_id
            batch_ids.add(ctx.record.batch_id)
        assert len(batch_ids) == 1  # 12 rows: one call
    finally:
        await plane.close()


@pytest.mark.parametrize(("batching", "error"), [
    ({"max_delay_ms": 2}, "batching.max_batch_size: is required"),
    ({"max_batch_size": 0, "max_delay_ms": 2}, "batching.max_batch_size: must be at least 1"),
    ({"max_batch_size": 8, "max_delay_ms": -1}, "batching.max_delay_ms: must be a number of milliseconds"),
    ({"max_batch_size": 8, "max_delay_ms": 2, "preferred_batch_sizes": [4, 16]},
     "batching.preferred_batch_sizes: 16 is more than max_batch_size (8)"),
    ({"max_batch_size": 8, "max_delay_ms": 2, "preferred_batch_sizes": [0]}, "integers >= 1"),
    ({"max_batch_size": 8, "max_delay_ms": 2, "max_queue": 0}, "batching.max_queue: must be at least 1"),
    ({"max_batch_size": 8, "max_delay_ms": 2, "max_wait": 1}, "batching.max_wait: unknown key"),
])
def test_batching_options_are_checked(batching: dict[str, Any], error: str) -> None:
    from gateway.config.node import ConfigError

    data = yaml.safe_load(BUILTIN)
    data["routes"][0]["batching"] = batching
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert error in str(caught.value)


def test_batching_needs_an_upstream_with_a_batch_dimension() -> None:
    from gateway.config.node import ConfigError

    data = yaml.safe_load(BUILTIN)
    data["upstreams"].append({"name": "um", "protocol": "umbridge", "endpoints": ["127.0.0.1:4242"]})
    data["routes"][0]["upstream"] = "um"
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert "upstream 'um' speaks umbridge; batching needs an upstream of protocol v2-rest, v2-grpc" in str(caught.value)


def test_the_schema_knows_batching() -> None:
    import jsonschema

    from gateway.app import configure

    validator = jsonschema.Draft202012Validator(configure.build_schema())
    data = yaml.safe_load(BUILTIN)
    data["routes"][0]["batching"].update(preferred_batch_sizes=[4, 8], max_queue=64)
    assert list(validator.iter_errors(data)) == []
    parse_config(data)
    data["routes"][0]["batching"]["max_wait"] = 1
    assert list(validator.iter_errors(data))


async def test_umbridge_evaluations_through_their_v2_mapping_share_a_batch() -> None:
    """UM-Bridge calls become V2 requests with a batch dimension (the model's
    metadata has -1 first): a batching route stacks them like any other."""
    from gateway.protocols.umbridge.bridge import Bridge
    from gateway.protocols.umbridge.mapping import build_view

    text = BUILTIN.replace("{model: simple}", "{model: trig}").replace("v2-rest", "umbridge")
    config = parse_config(yaml.safe_load(text))
    plane = DataPlane(config, GatewayServices(config, config.server), backends=registry.backend)
    await plane.start()
    try:
        client = plane.clusters["local"].clients[0]
        seen: list[InferRequest] = []
        original = client.infer

        async def counting(request: InferRequest, ctx: RequestContext) -> InferResponse:
            seen.append(request)
            return await original(request, ctx)

        client.infer = counting  # type: ignore[method-assign]
        metadata = await plane.model_metadata("trig", "", RequestContext("rest", "umbridge"))
        view = build_view("trig", metadata, None)
        points = [(np.array([0.1 * i, -1.0 + i]), np.array([2.0 + i])) for i in range(6)]
        bridges = [Bridge(plane, RequestContext("rest", "umbridge", f"u{i}"), view, "") for i in range(6)]
        answers = await _all(*(b.evaluate_point(list(p), None) for b, p in zip(bridges, points, strict=True)))
        for (x, y), answer in zip(points, answers, strict=True):
            (f, g), _ = answer
            np.testing.assert_allclose(f, [np.sin(x[0]) * y[0], x[0] * x[1] ** 2], rtol=1e-5)
            np.testing.assert_allclose(g, [np.exp(x[1] / 2) + y[0] ** 2], rtol=1e-5)
        assert [r.inputs[0].shape[0] for r in seen] == [6]
    finally:
        await plane.close()


async def _builtin_plane(batching: str, timeout: str = "") -> DataPlane:
    text = BUILTIN.replace("batching: {max_batch_size: 16, max_delay_ms: 20}", f"batching: {batching}{timeout}")
    config = parse_config(yaml.safe_load(text))
    plane = DataPlane(config, GatewayServices(config, config.server), backends=registry.backend)
    await plane.start()
    return plane


def _simple(i: int) -> tuple[InferRequest, RequestContext]:
    a = np.full((1, 16), i, dtype=np.int32)
    request = InferRequest("simple", inputs=[Tensor.from_numpy("INPUT0", a), Tensor.from_numpy("INPUT1", a)])
    return request, RequestContext("rest", "v2-rest", request_id=f"req-{i}")


async def test_a_retry_sends_the_whole_batch_again() -> None:
    from gateway.core.errors import connect_failure

    plane = await _builtin_plane("{max_batch_size: 4, max_delay_ms: 1000}")
    try:
        client = plane.clusters["local"].clients[0]
        seen: list[int] = []
        original = client.infer

        async def flaky(request: InferRequest, ctx: RequestContext) -> InferResponse:
            seen.append(request.inputs[0].shape[0])
            if len(seen) == 1:
                raise connect_failure("'local'", "ConnectionRefusedError")
            return await original(request, ctx)

        client.infer = flaky  # type: ignore[method-assign]
        calls = [_simple(i) for i in range(4)]
        responses = await _all(*(plane.infer(r, c) for r, c in calls))
        for (request, ctx), response in zip(calls, responses, strict=True):
            assert isinstance(response, InferResponse), response
            np.testing.assert_array_equal(response.outputs[0].data, request.inputs[0].data * 2)
            assert ctx.record.upstream_attempts == 2
        assert seen == [4, 4]  # the default policy retries a connect failure: the batch, whole
    finally:
        await plane.close()


async def test_a_member_s_deadline_counts_from_its_own_arrival() -> None:
    plane = await _builtin_plane("{max_batch_size: 4, max_delay_ms: 3000}", "\n    timeout: 100ms")
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        (response,) = await _all(plane.infer(*_simple(1)))
        assert isinstance(response, GatewayError) and response.kind is ErrorKind.UPSTREAM_TIMEOUT, response
        assert loop.time() - started < 2.0  # its own 100 ms, not the batch's 3 s delay
        (batcher,) = plane._current.batchers.values()
        assert batcher.queued == 0
    finally:
        await plane.close()


async def test_a_sequence_s_requests_are_never_batched() -> None:
    """Sequence steps change per-sequence state: batching two steps of one
    sequence (same parameters, so the key alone would allow it) would apply
    one request's state change twice. They go alone, in order."""
    text = BUILTIN.replace("match: {model: simple}", 'match: {model: "*"}')
    config = parse_config(yaml.safe_load(text))
    plane = DataPlane(config, GatewayServices(config, config.server), backends=registry.backend)
    await plane.start()
    try:
        def step(value: int, **flags: bool) -> tuple[InferRequest, RequestContext]:
            data = np.full((1, 1), value, dtype=np.int32)
            request = InferRequest("simple_string_dyna_sequence", inputs=[Tensor.from_numpy("INPUT", data)],
                                   parameters={"sequence_id": "77", **flags})
            return request, RequestContext("rest", "v2-rest")

        start, start_ctx = step(5, sequence_start=True)
        await plane.infer(start, start_ctx)
        calls = [step(1), step(1)]
        responses = await _all(*(plane.infer(r, c) for r, c in calls))
        assert sorted(int(r.outputs[0].data[0, 0]) for r in responses) == [6, 7]  # a running sum, step by step
        assert not start_ctx.record.batch_id and not any(c.record.batch_id for _, c in calls)
    finally:
        await plane.close()
