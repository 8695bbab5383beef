"""Dynamic batching end to end: unmodified tritonclient (HTTP JSON, HTTP
binary, gRPC) -> the gateway -> a real MLServer (REST and gRPC upstreams)
serving rows_5ms (5 ms per call whatever its rows, MLServer's own batching
off; tests/peers/mlserver_models/rows_5ms.py). Every client must get its
own rows back, whatever batch they rode in."""

from __future__ import annotations

import json
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from peers.mlserver import MLServerPeer
from support import GatewayProcess, metric_value, scrape_metrics, wait_for, write_config

CLIENTS = 64
TIMEOUT = 30.0  # bound on every client call: none may hang
POISON = -7  # rows_5ms fails a call holding it
FULL_BATCH_WAIT = 8.0  # bound on a call whose batch is sent because it is full


@pytest.fixture(scope="module")
def gateway(mlserver: MLServerPeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("batching")
    log = directory / "access.jsonl"
    config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: ml-rest, protocol: v2-rest, endpoints: ["{mlserver.rest_address}"]}}
  - {{name: ml-grpc, protocol: v2-grpc, endpoints: ["{mlserver.grpc_address}"]}}
routes:
  - name: via-rest
    match: {{model: via_rest}}
    rewrite: {{model: rows_5ms}}
    upstream: ml-rest
    batching: {{max_batch_size: 32, max_delay_ms: 10}}
  - name: via-grpc
    match: {{model: via_grpc}}
    rewrite: {{model: rows_5ms}}
    upstream: ml-grpc
    batching: {{max_batch_size: 32, max_delay_ms: 10}}
  - name: poisoned
    match: {{model: poisoned}}
    rewrite: {{model: rows_5ms}}
    upstream: ml-rest
    batching: {{max_batch_size: 4, max_delay_ms: 10000}}  # longer than FULL_BATCH_WAIT
  - name: slow
    match: {{model: slow}}
    rewrite: {{model: rows_5ms}}
    upstream: ml-grpc
    batching: {{max_batch_size: 32, max_delay_ms: 400, max_queue: 2}}
observability:
  access_log: {{format: json, destination: "{log}"}}
"""
    with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
        yield gw


def _expected(array: np.ndarray) -> np.ndarray:
    if array.dtype == object:
        return np.array([bytes(x)[::-1] + b"!" for x in array.reshape(-1)], dtype=object).reshape(array.shape)
    return (array * 2 + 1).astype(array.dtype)


def _array(i: int, rows: int, kind: str = "INT32", width: int = 4) -> np.ndarray:
    """Rows no other client sends: they carry the client's number."""
    if kind == "BYTES":
        return np.array([f"c{i}-r{r}-{c}".encode() for r in range(rows) for c in range(width)],
                        dtype=object).reshape(rows, width)
    values = np.arange(rows * width).reshape(rows, width) + 1000 * i
    return values.astype(np.int32 if kind == "INT32" else np.float32)


def _http_infer(url: str, model: str, array: np.ndarray, binary: bool, timeout: float = TIMEOUT) -> np.ndarray:
    with httpclient.InferenceServerClient(url, network_timeout=timeout, connection_timeout=timeout) as client:
        item = httpclient.InferInput("X", list(array.shape), np_to_triton_dtype(array.dtype))
        item.set_data_from_numpy(array, binary_data=binary)
        result = client.infer(model, [item], outputs=[httpclient.InferRequestedOutput("X_OUT", binary_data=binary)])
        out = result.as_numpy("X_OUT")
    assert out is not None
    return out


def _grpc_infer(url: str, model: str, array: np.ndarray) -> np.ndarray:
    with grpcclient.InferenceServerClient(url) as client:
        item = grpcclient.InferInput("X", list(array.shape), np_to_triton_dtype(array.dtype))
        item.set_data_from_numpy(array)
        out = client.infer(model, [item], client_timeout=TIMEOUT).as_numpy("X_OUT")
    assert out is not None
    return out


def _call(gateway: GatewayProcess, way: str, model: str, array: np.ndarray) -> np.ndarray:
    if way == "grpc":
        return _grpc_infer(gateway.url("grpc"), model, array)
    return _http_infer(gateway.url("rest"), model, array, binary=way == "binary")


WAYS = ("json", "binary", "grpc")


def _run_clients(work: Callable[[int], Any], clients: int = CLIENTS) -> list[Any]:
    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(work, i) for i in range(clients)]
        return [f.result(timeout=TIMEOUT * 3) for f in futures]


def _rows_per_call(mlserver: MLServerPeer, since: int) -> list[int]:
    return [int(call["rows"]) for call in mlserver.calls("rows_5ms")[since:]]


@pytest.mark.parametrize("model", ["via_rest", "via_grpc"])
def test_64_concurrent_clients_each_get_their_own_rows(gateway: GatewayProcess, mlserver: MLServerPeer,
                                                       model: str) -> None:
    before = len(mlserver.calls("rows_5ms"))
    sent = {i * 10 + n: _array(i * 10 + n, rows=1 + (i + n) % 2) for i in range(CLIENTS) for n in range(3)}

    def client(i: int) -> None:
        for n in range(3):
            array = sent[i * 10 + n]
            out = _call(gateway, WAYS[(i + n) % 3], model, array)
            np.testing.assert_array_equal(out, _expected(array))

    _run_clients(client)
    calls = mlserver.calls("rows_5ms")[before:]
    rows = [int(call["rows"]) for call in calls]
    assert sum(rows) == sum(len(array) for array in sent.values())  # every row went up ...
    # ... exactly once: each row's first number names its client and request.
    went_up = Counter(first for call in calls for first in call["firsts"])
    assert went_up == Counter(int(row[0]) for array in sent.values() for row in array)
    assert max(rows) > 2 and max(rows) <= 32  # in batches (JSON, binary and gRPC clients apart)


def test_mixed_shapes_and_datatypes_interleaved_are_all_correct(gateway: GatewayProcess) -> None:
    kinds = [("INT32", 4), ("FP32", 4), ("INT32", 3), ("BYTES", 2), ("FP32", 7)]

    def client(i: int) -> None:
        for n in range(2):
            kind, width = kinds[(i + n) % len(kinds)]
            array = _array(i * 10 + n, rows=1 + i % 2, kind=kind, width=width)
            out = _call(gateway, WAYS[(i + 2 * n) % 3], ("via_rest", "via_grpc")[i % 2], array)
            assert out.shape == array.shape
            if kind == "BYTES":
                got = [x.encode() if isinstance(x, str) else bytes(x) for x in out.reshape(-1)]  # JSON: str
                assert got == list(_expected(array).reshape(-1))
            else:
                np.testing.assert_array_equal(out, _expected(array))

    _run_clients(client, 40)


def test_a_poisoned_member_fails_alone_and_none_hangs(gateway: GatewayProcess, mlserver: MLServerPeer) -> None:
    """MLServer refuses the batch (400) for one member's value: each member
    is then sent alone, so only the poisoned one is refused."""
    before = len(mlserver.calls("rows_5ms"))

    def client(i: int) -> str:
        array = _array(i, rows=1)
        if i == 2:
            array[0, 0] = POISON
        try:
            out = _http_infer(gateway.url("rest"), "poisoned", array, binary=False, timeout=FULL_BATCH_WAIT)
        except InferenceServerException as exc:
            return str(exc)
        np.testing.assert_array_equal(out, _expected(array))
        return "answered"

    # max_batch_size 4: one batch, sent when full; waiting out its 10 s delay would time the clients out.
    answers = _run_clients(client, 4)
    assert answers[:2] + answers[3:] == ["answered"] * 3, answers
    assert "poison" in answers[2] and "[400]" in answers[2], answers
    # the batch failed before the model noted it; then the three innocent members, alone
    assert _rows_per_call(mlserver, before) == [1, 1, 1]


def _raw_post(port: int, model: str, array: np.ndarray) -> socket.socket:
    body = orjson.dumps({"inputs": [{"name": "X", "datatype": "INT32", "shape": list(array.shape),
                                     "data": array.reshape(-1).tolist()}]})
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.sendall(f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def test_a_member_whose_client_leaves_while_waiting_is_dropped(gateway: GatewayProcess,
                                                               mlserver: MLServerPeer) -> None:
    """The slow route waits 400 ms: the leaving client is surely gone before its batch is sent."""
    before = len(mlserver.calls("rows_5ms"))
    with ThreadPoolExecutor(1) as pool:
        staying = _array(9, rows=1)
        answer = pool.submit(_grpc_infer, gateway.url("grpc"), "slow", staying)
        time.sleep(0.05)
        leaving = _raw_post(gateway.ports["rest"], "slow", _array(10, rows=2))
        time.sleep(0.1)
        leaving.close()
        np.testing.assert_array_equal(answer.result(TIMEOUT), _expected(staying))
    # The JSON client and the gRPC client disagree on nothing that matters: one batch, the leaver's rows not in it.
    wait_for(lambda: len(mlserver.calls("rows_5ms")) > before, 5, "the call to be noted")
    assert _rows_per_call(mlserver, before) == [1]


def test_past_max_queue_the_client_is_told_to_slow_down(gateway: GatewayProcess) -> None:
    with ThreadPoolExecutor(2) as pool:
        waiting = [pool.submit(_grpc_infer, gateway.url("grpc"), "slow", _array(20 + i, rows=1)) for i in range(2)]
        time.sleep(0.1)  # both queued (the route waits 400 ms)
        with pytest.raises(InferenceServerException) as caught:
            _http_infer(gateway.url("rest"), "slow", _array(30, rows=1), binary=False)
        assert caught.value.status() == "429" and "max_queue" in caught.value.message(), caught.value
        with pytest.raises(InferenceServerException) as grpc_caught:
            _grpc_infer(gateway.url("grpc"), "slow", _array(31, rows=1))
        assert grpc_caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        for i, future in enumerate(waiting):
            np.testing.assert_array_equal(future.result(TIMEOUT), _expected(_array(20 + i, rows=1)))


def test_batches_are_measured_and_logged(gateway: GatewayProcess) -> None:
    _run_clients(lambda i: _call(gateway, "json", "via_rest", _array(40 + i, rows=1)), 8)
    samples = scrape_metrics(gateway)
    assert metric_value(samples, "gateway_batch_size_count", route="via-rest") > 0
    assert metric_value(samples, "gateway_batch_queue_seconds_count", route="via-rest") >= 8
    log = Path(str(gateway.config_path.parent / "access.jsonl"))

    def logged() -> list[dict[str, Any]]:
        return [json.loads(line) for line in log.read_text().splitlines() if '"via_rest"' in line]

    wait_for(lambda: len(logged()) >= 8, 5, "the access log")
    assert all(line.get("batch") and line["upstream"] == "ml-rest" for line in logged()[-8:])
