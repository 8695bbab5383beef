"""The response_cache policy: a request asked before on the route is answered
without calling the upstream, in whatever protocol the client speaks (V2
REST binary and JSON, V2 gRPC through tritonclient); one byte, parameter or
requested output different is a miss; answers expire after ttl and the
least recently used go past max_bytes; sequences and streams are never
cached; hits and misses show in /metrics and in tritonclient's
get_inference_statistics. The upstreams are the builtin models and, for the
pass-through path, a second gateway process spoken to over V2 REST."""

from __future__ import annotations

import itertools
import queue
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from gateway.core.types import Tensor
from gateway.dataplane.filters.cache_store import answer_size
from support import GatewayProcess, metric_value, scrape_metrics, wait_for, write_config

SHORT_TTL = 0.5


def _simple_answer_size() -> int:
    """What the cache charges for one answer of ``simple`` (two INT32 [1, 16] outputs)."""
    data = np.zeros((1, 16), dtype=np.int32)
    return answer_size([Tensor.from_numpy("OUTPUT0", data), Tensor.from_numpy("OUTPUT1", data)])


# Room for two answers of `simple`, not three.
SMALL_MAX_BYTES = 2 * _simple_answer_size() + _simple_answer_size() // 2

BACK = """
admin: {address: null}
listeners: [{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}]
upstreams: [{name: local, protocol: builtin}]
routes: [{match: {model: "*"}, upstream: local}]
"""


def _front(back_rest: str) -> str:
    return f"""
admin: {{address: "127.0.0.1:0"}}
server:
  extensions: [classification, model_configuration, model_repository, statistics, system_shared_memory]
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin}}
  - {{name: back, protocol: v2-rest, endpoints: ["{back_rest}"]}}
policies:
  - {{name: cache, response_cache: {{ttl: 60s, max_bytes: 16MiB}}}}
  - {{name: short, response_cache: {{ttl: {SHORT_TTL}}}}}
  - {{name: small, response_cache: {{max_bytes: {SMALL_MAX_BYTES}}}}}
routes:
  - {{name: via-back, match: {{model: simple, headers: {{x-cache: back}}}}, upstream: back, policies: [cache]}}
  - {{name: short, match: {{model: simple, headers: {{x-cache: short}}}}, upstream: local, policies: [short]}}
  - {{name: small, match: {{model: simple, headers: {{x-cache: small}}}}, upstream: local, policies: [small]}}
  - {{name: cached, match: {{model: "*"}}, upstream: local, policies: [cache]}}
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("response_cache")
    with GatewayProcess(write_config(directory, BACK, "back.yaml"), directory / "back.log") as back, \
            GatewayProcess(write_config(directory, _front(back.url("rest"))), directory / "front.log") as front:
        yield front


_values = itertools.count(1000)


def _fresh() -> np.ndarray:
    """Input data no other test of this module sends (a key of its own)."""
    return np.full((1, 16), next(_values), dtype=np.int32) + np.arange(16, dtype=np.int32)


def _inputs(module: Any, a: np.ndarray, b: np.ndarray | None = None, binary: bool = True) -> list[Any]:
    inputs = []
    for name, data in (("INPUT0", a), ("INPUT1", a if b is None else b)):
        item = module.InferInput(name, [1, 16], "INT32")
        if module is httpclient:
            item.set_data_from_numpy(data, binary_data=binary)
        else:
            item.set_data_from_numpy(data)
        inputs.append(item)
    return inputs


class Counts:
    """Upstream calls and cache results, as deltas since it was made."""

    def __init__(self, gw: GatewayProcess, upstream: str = "local") -> None:
        self.gw, self.upstream = gw, upstream
        self.start = self._now()

    def _now(self) -> tuple[float, float, float, float]:
        samples = scrape_metrics(self.gw)
        return (metric_value(samples, "gateway_upstream_requests_total", upstream=self.upstream),
                *(metric_value(samples, "gateway_cache_requests_total", result=r) for r in ("hit", "miss", "skip")))

    def delta(self) -> tuple[int, int, int, int]:
        """(upstream calls, hits, misses, skips) since this was made."""
        now = self._now()
        calls, hits, misses, skips = (int(n - s) for n, s in zip(now, self.start, strict=True))
        return calls, hits, misses, skips


def _client(gw: GatewayProcess, kind: str) -> Any:
    return (httpclient if kind == "rest" else grpcclient).InferenceServerClient(gw.url(kind))


def _id(result: Any) -> str:
    response = result.get_response()
    return str(response["id"] if isinstance(response, dict) else response.id)


@pytest.mark.parametrize("kind", ["rest", "grpc"])
def test_the_same_request_twice_calls_the_upstream_once(gateway: GatewayProcess, kind: str) -> None:
    module = httpclient if kind == "rest" else grpcclient
    a = _fresh()
    counts = Counts(gateway)
    with _client(gateway, kind) as client:
        first = client.infer("simple", _inputs(module, a), request_id="first")
        second = client.infer("simple", _inputs(module, a), request_id="second")
    assert counts.delta() == (1, 1, 1, 0)
    for name, expected in (("OUTPUT0", a + a), ("OUTPUT1", a - a)):
        np.testing.assert_array_equal(first.as_numpy(name), expected)
        np.testing.assert_array_equal(second.as_numpy(name), expected)
    assert (_id(first), _id(second)) == ("first", "second")  # a hit is the asking request's own answer


def test_the_same_tensors_in_every_protocol_are_one_question(gateway: GatewayProcess) -> None:
    a = _fresh()
    counts = Counts(gateway)
    answers = []
    names = ("OUTPUT0", "OUTPUT1")  # the same outputs asked for: how each is written is the client's own
    with _client(gateway, "rest") as client:
        for binary in (True, False):  # binary tensors both ways, then JSON both ways
            answers.append(client.infer("simple", _inputs(httpclient, a, binary=binary), outputs=[
                httpclient.InferRequestedOutput(name, binary_data=binary) for name in names]))
    with _client(gateway, "grpc") as client:
        answers.append(client.infer("simple", _inputs(grpcclient, a),
                                    outputs=[grpcclient.InferRequestedOutput(name) for name in names]))
    assert counts.delta() == (1, 2, 1, 0)
    for answer in answers:
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), a + a)
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT1"), a - a)


def test_bytes_tensors_in_every_protocol_are_one_question(gateway: GatewayProcess) -> None:
    items = np.array([b"cache-%d" % next(_values), b"", "\u00e9t\u00e9".encode()], dtype=object)
    counts = Counts(gateway)
    answers = []
    with _client(gateway, "rest") as client:
        for binary in (True, False):
            item = httpclient.InferInput("INPUT0", [3], "BYTES")
            item.set_data_from_numpy(items, binary_data=binary)
            answers.append(client.infer("identity", [item],
                                        outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]))
    with _client(gateway, "grpc") as client:
        item = grpcclient.InferInput("INPUT0", [3], "BYTES")
        item.set_data_from_numpy(items)
        answers.append(client.infer("identity", [item], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")]))
    assert counts.delta() == (1, 2, 1, 0)
    for answer in answers:
        assert [bytes(v) if not isinstance(v, str) else v.encode() for v in answer.as_numpy("OUTPUT0")] == list(items)


@pytest.mark.parametrize("kind", ["rest", "grpc"])
def test_a_big_tensor_is_cached_whole(gateway: GatewayProcess, kind: str) -> None:
    """4 MiB: hashed and copied in the offload pool, not on the loop."""
    module = httpclient if kind == "rest" else grpcclient
    big = np.random.default_rng(next(_values)).random((1, 1 << 20), dtype=np.float32)
    counts = Counts(gateway)
    with _client(gateway, kind) as client:
        answers = []
        for _ in range(2):
            item = module.InferInput("INPUT0", list(big.shape), "FP32")
            item.set_data_from_numpy(big)
            answers.append(client.infer("identity", [item]).as_numpy("OUTPUT0"))
    assert counts.delta() == (1, 1, 1, 0)
    for answer in answers:
        np.testing.assert_array_equal(answer, big)


def test_one_byte_a_parameter_or_an_output_different_is_a_miss(gateway: GatewayProcess) -> None:
    a = _fresh()
    other = a.copy()
    other.reshape(-1).view(np.uint8)[5] ^= 1  # one byte of one element
    counts = Counts(gateway)
    with _client(gateway, "grpc") as client:
        client.infer("simple", _inputs(grpcclient, a))
        changed = client.infer("simple", _inputs(grpcclient, a, other))
        client.infer("simple", _inputs(grpcclient, a), parameters={"temperature": 2})
        only = client.infer("simple", _inputs(grpcclient, a), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert counts.delta() == (4, 0, 4, 0)
    np.testing.assert_array_equal(changed.as_numpy("OUTPUT0"), a + other)
    assert only.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(only.as_numpy("OUTPUT1"), a - a)


def test_an_answer_expires_after_ttl(gateway: GatewayProcess) -> None:
    a = _fresh()
    headers = {"x-cache": "short"}
    counts = Counts(gateway)
    with _client(gateway, "rest") as client:
        stored = time.monotonic()
        client.infer("simple", _inputs(httpclient, a), headers=headers)
        client.infer("simple", _inputs(httpclient, a), headers=headers)
        assert counts.delta()[:3] == (1, 1, 1)

        def expired() -> bool:
            client.infer("simple", _inputs(httpclient, a), headers=headers)
            return counts.delta()[2] == 2

        wait_for(expired, 10, "the cached answer to expire", interval=0.1)
    assert time.monotonic() - stored >= SHORT_TTL  # never before its time


def test_the_least_recently_used_answer_goes_past_max_bytes(gateway: GatewayProcess) -> None:
    first, second, third = _fresh(), _fresh(), _fresh()
    headers = {"x-cache": "small"}
    with _client(gateway, "grpc") as client:
        def ask(a: np.ndarray) -> int:
            """Upstream calls it took."""
            counts = Counts(gateway)
            client.infer("simple", _inputs(grpcclient, a), headers=headers)
            return counts.delta()[0]

        assert [ask(first), ask(second)] == [1, 1]
        assert ask(first) == 0  # kept; now the most recently used
        assert ask(third) == 1  # room for two: `second` goes
        assert [ask(first), ask(third), ask(second)] == [0, 0, 1]


def test_sequences_and_streams_are_never_cached(gateway: GatewayProcess) -> None:
    value = np.array([[7]], dtype=np.int32)
    counts = Counts(gateway)
    with _client(gateway, "grpc") as client:
        for _ in range(2):
            item = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            item.set_data_from_numpy(value)
            client.infer("simple_sequence", [item], sequence_id=4242, sequence_start=True, sequence_end=True)
        answers: queue.Queue[Any] = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            a = _fresh()
            for _ in range(2):
                client.async_stream_infer("simple", _inputs(grpcclient, a))
            for _ in range(2):
                result, error = answers.get(timeout=10)
                assert error is None
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
        finally:
            client.stop_stream()
    assert counts.delta() == (4, 0, 0, 4)


def _statistics(gw: GatewayProcess, kind: str) -> tuple[int, int, int, int]:
    """(cache hits, cache misses, successes, inference_count) of `simple`, over its routes."""
    with _client(gw, kind) as client:
        stats = client.get_inference_statistics("simple")
    fields = ("cache_hit", "cache_miss", "success")
    entries = stats["model_stats"] if kind == "rest" else [
        {"inference_count": s.inference_count,
         "inference_stats": {field: {"count": getattr(s.inference_stats, field).count} for field in fields}}
        for s in stats.model_stats]
    return (sum(e["inference_stats"]["cache_hit"]["count"] for e in entries),
            sum(e["inference_stats"]["cache_miss"]["count"] for e in entries),
            sum(e["inference_stats"]["success"]["count"] for e in entries),
            sum(int(e["inference_count"]) for e in entries))


@pytest.mark.parametrize("kind", ["rest", "grpc"])
def test_the_statistics_extension_shows_hits_and_misses(gateway: GatewayProcess, kind: str) -> None:
    module = httpclient if kind == "rest" else grpcclient
    before = _statistics(gateway, kind)
    a = _fresh()
    with _client(gateway, kind) as client:
        for _ in range(3):
            client.infer("simple", _inputs(module, a))
    hits, misses, successes, inferences = (n - b for n, b in zip(_statistics(gateway, kind), before, strict=True))
    # As Triton counts: every request a success, only the miss an inference.
    assert (hits, misses, successes, inferences) == (2, 1, 3, 1)


@pytest.mark.parametrize("kind", ["rest", "grpc"])
def test_a_relaying_upstream_is_cached_as_tensors(gateway: GatewayProcess, kind: str) -> None:
    """A V2 REST upstream with pass-through on: the miss goes translated, the
    hit answers in the client's protocol with its own id and tensors."""
    module = httpclient if kind == "rest" else grpcclient
    a = _fresh()
    headers = {"x-cache": "back"}
    counts = Counts(gateway, upstream="back")
    with _client(gateway, kind) as client:
        first = client.infer("simple", _inputs(module, a), headers=headers, request_id="one")
        second = client.infer("simple", _inputs(module, a), headers=headers, request_id="two")
    assert counts.delta()[:3] == (1, 1, 1)
    assert (_id(first), _id(second)) == ("one", "two")
    for answer in (first, second):
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), a + a)
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT1"), a - a)


@pytest.mark.parametrize("kind", ["rest", "grpc"])
def test_shared_memory_tensors_are_keyed_by_their_contents(gateway: GatewayProcess, kind: str) -> None:
    """The listener reads input regions before the filter chain and writes
    output regions after it: the cache keys what a region holds, and a hit
    is written into the output region like any answer."""
    module = httpclient if kind == "rest" else grpcclient
    a = _fresh()
    size = a.nbytes
    tag = uuid.uuid4().hex[:8]
    handles = [shm.create_shared_memory_region(f"{name}-{tag}", f"/gw-cache-{name}-{tag}", 2 * size)
               for name in ("in", "out")]
    try:
        with _client(gateway, kind) as client:
            for name in ("in", "out"):
                client.register_system_shared_memory(f"{name}-{tag}", f"/gw-cache-{name}-{tag}", 2 * size)

            def ask(b: np.ndarray) -> tuple[int, np.ndarray]:
                """(upstream calls it took, OUTPUT0 as the out region holds it)."""
                shm.set_shared_memory_region(handles[0], [a, b])
                shm.set_shared_memory_region(handles[1], [np.zeros_like(a), np.zeros_like(a)])
                inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
                for index, item in enumerate(inputs):
                    item.set_shared_memory(f"in-{tag}", size, offset=index * size)
                outputs = [module.InferRequestedOutput(name) for name in ("OUTPUT0", "OUTPUT1")]
                for index, output in enumerate(outputs):
                    output.set_shared_memory(f"out-{tag}", size, offset=index * size)
                counts = Counts(gateway)
                client.infer("simple", inputs, outputs=outputs)
                held = shm.get_contents_as_numpy(handles[1], np.int32, [1, 16])
                return counts.delta()[0], held.copy()  # `held` is a view of the mapping, unmapped below

            other = a + 1
            calls, first = ask(a)
            again_calls, again = ask(a)
            changed_calls, changed = ask(other)
            client.unregister_system_shared_memory()
    finally:
        for handle in handles:
            shm.destroy_shared_memory_region(handle)
    assert (calls, again_calls, changed_calls) == (1, 0, 1)
    np.testing.assert_array_equal(first, a + a)
    np.testing.assert_array_equal(again, a + a)  # the hit, written into the region
    np.testing.assert_array_equal(changed, a + other)
