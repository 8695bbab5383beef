"""One bad member must not fail its batch: real concurrent tritonclient
clients -> a gateway process batching the builtin ``simple_string``. A
member whose value the model refuses gets its own refusal; the others,
sent alone after the batch was refused, get their answers. A failure of
the whole batch (its upstream unreachable) still reaches every member,
saying the batch failed. (MLServer refusing one member's value:
tests/test_batching_gateway.py.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from support import GatewayProcess, free_port, metric_value, scrape_metrics, write_config

CLIENTS = 11
BAD = 4  # the client sending "not-a-number"
TIMEOUT = 30.0
DELAY_MS = 5000  # a batch goes when full: long before this, if every client joined it


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("batch-members")
    config = f"""
admin: {{address: "127.0.0.1:0"}}
listeners:
  - {{name: rest, protocol: v2-rest, address: "127.0.0.1:0"}}
  - {{name: grpc, protocol: v2-grpc, address: "127.0.0.1:0"}}
upstreams:
  - {{name: local, protocol: builtin}}
  - {{name: gone, protocol: v2-rest, endpoints: ["127.0.0.1:{free_port()}"]}}
routes:
  - name: strings
    match: {{model: simple_string}}
    upstream: local
    batching: {{max_batch_size: {CLIENTS}, max_delay_ms: {DELAY_MS}}}
  - name: unreachable
    match: {{model: unreachable}}
    upstream: gone
    batching: {{max_batch_size: 4, max_delay_ms: {DELAY_MS}}}
"""
    with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
        yield gw
    assert "Traceback" not in gw.log(), gw.log()[-3000:]


def _inputs(i: int) -> tuple[np.ndarray, np.ndarray]:
    first = np.array([str(100 * i + k).encode() for k in range(16)], dtype=object).reshape(1, 16)
    if i == BAD:
        first[0, 5] = b"not-a-number"
    return first, np.array([b"1"] * 16, dtype=object).reshape(1, 16)


def _infer(gateway: GatewayProcess, way: str, model: str, i: int) -> np.ndarray:
    arrays = _inputs(i)
    if way == "grpc":
        with grpcclient.InferenceServerClient(gateway.url("grpc")) as client:
            items = [grpcclient.InferInput(f"INPUT{n}", [1, 16], "BYTES") for n in range(2)]
            for item, array in zip(items, arrays, strict=True):
                item.set_data_from_numpy(array)
            out = client.infer(model, items, client_timeout=TIMEOUT).as_numpy("OUTPUT0")
    else:
        with httpclient.InferenceServerClient(gateway.url("rest"), network_timeout=TIMEOUT) as rest:
            items = [httpclient.InferInput(f"INPUT{n}", [1, 16], "BYTES") for n in range(2)]
            for item, array in zip(items, arrays, strict=True):
                item.set_data_from_numpy(array, binary_data=False)
            out = rest.infer(model, items).as_numpy("OUTPUT0")
    assert out is not None
    return out


def _together(work: object, clients: int) -> list[object]:
    """``work(i)`` for every client at once: its answer, or the error it raised."""
    def outcome(i: int) -> object:
        try:
            return work(i)  # type: ignore[operator]
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(clients) as pool:
        return [f.result(timeout=TIMEOUT * 2) for f in [pool.submit(outcome, i) for i in range(clients)]]


@pytest.mark.parametrize("way", ["json", "grpc"])
def test_a_member_with_a_bad_value_fails_alone(gateway: GatewayProcess, way: str) -> None:
    calls_before = metric_value(scrape_metrics(gateway), "gateway_batch_size_count", route="strings")
    started = time.monotonic()
    answers = _together(lambda i: _infer(gateway, way, "simple_string", i), CLIENTS)
    assert time.monotonic() - started < DELAY_MS / 1000 - 0.5  # one full batch, sent at once
    for i, answer in enumerate(answers):
        if i == BAD:
            assert isinstance(answer, InferenceServerException), answer
            assert "INPUT0 must hold decimal integers as strings" in (answer.message() or "")
            assert answer.status() in ("400", "StatusCode.INVALID_ARGUMENT"), answer
            continue
        assert not isinstance(answer, InferenceServerException), f"client {i}: {answer}"
        got = [int(x) for x in np.asarray(answer).reshape(-1)]
        assert got == [100 * i + k + 1 for k in range(16)], (i, got)
    calls = metric_value(scrape_metrics(gateway), "gateway_batch_size_count", route="strings") - calls_before
    assert calls == 1 + CLIENTS  # the refused batch, then each member alone


def test_a_failure_of_the_whole_batch_fails_every_member_saying_so(gateway: GatewayProcess) -> None:
    answers = _together(lambda i: _infer(gateway, "json", "unreachable", (i + 1) * 10), 4)
    for answer in answers:
        assert isinstance(answer, InferenceServerException), answer
        message = answer.message() or ""
        assert answer.status() == "503", answer
        assert "the whole batch of 4 requests failed" in message and "127.0.0.1" not in message, message


def test_a_member_the_model_refuses_by_its_declaration_never_joins_a_batch(gateway: GatewayProcess) -> None:
    """The builtin model's declared inputs (names, datatypes, shapes) are
    checked before a request joins: refused at once, no batch waits for it."""
    calls_before = metric_value(scrape_metrics(gateway), "gateway_batch_size_count", route="strings")
    item = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    item.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16), binary_data=False)
    other = httpclient.InferInput("INPUT1", [1, 16], "INT32")
    other.set_data_from_numpy(np.ones((1, 16), np.int32), binary_data=False)
    started = time.monotonic()
    with httpclient.InferenceServerClient(gateway.url("rest"), network_timeout=TIMEOUT) as rest, \
            pytest.raises(InferenceServerException) as refused:
        rest.infer("simple_string", [item, other])
    assert time.monotonic() - started < DELAY_MS / 1000 / 2  # it waited for no batch
    assert refused.value.status() == "400" and "must be BYTES" in (refused.value.message() or ""), refused.value
    assert metric_value(scrape_metrics(gateway), "gateway_batch_size_count", route="strings") == calls_before
