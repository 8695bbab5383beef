"""The V1 REST codec on its own: requests to tensors (with and without the
model's metadata) and tensors to answers, as docs/protocols.md states."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
import pytest

from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.limits import TensorAllowance
from gateway.core.tensors import float_to_bf16
from gateway.core.types import Tensor, TensorSpec
from gateway.protocols.v1_rest import codec, upstream_codec

SPECS = (TensorSpec("a", "INT32", (-1, 2)), TensorSpec("b", "BYTES", (-1,)))


def allowance(max_elements: int = 1 << 20, max_bytes_element: int = 1 << 16) -> TensorAllowance:
    return TensorAllowance(max_elements, max_elements, 64 << 20, max_bytes_element)


def decode(body: Any, specs: tuple[TensorSpec, ...] = (), limit: TensorAllowance | None = None) -> codec.Predict:
    return codec.decode_predict(orjson.dumps(body), specs, limit or allowance())


def refused(body: Any, specs: tuple[TensorSpec, ...] = (), limit: TensorAllowance | None = None) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        decode(body, specs, limit)
    return info.value


def test_rows_stack_along_a_new_first_dimension() -> None:
    predict = decode({"instances": [{"a": [1, 2], "b": "x"}, {"a": [3, 4], "b": {"b64": "/w=="}}]}, SPECS)
    a, b = predict.inputs
    assert (a.name, a.datatype, a.shape) == ("a", "INT32", (2, 2)) and a.data.tolist() == [[1, 2], [3, 4]]
    assert (b.datatype, b.shape) == ("BYTES", (2,)) and b.data.tolist() == [b"x", b"\xff"]
    assert predict.rows == 2


def test_columns_are_whole_tensors() -> None:
    predict = decode({"inputs": {"a": [[1, 2]], "b": ["x", "y"]}, "parameters": {"p": 1, "q": "s"}}, SPECS)
    assert [t.shape for t in predict.inputs] == [(1, 2), (2,)]
    assert predict.rows is None and predict.parameters == {"p": 1, "q": "s"}


@pytest.mark.parametrize(("values", "datatype"), [
    ([1, 2], "INT64"), ([1, 2.5], "FP32"), ([True, False], "BOOL"), (["x", {"b64": "eA=="}], "BYTES"), ([], "FP32"),
])
def test_defaults_without_metadata(values: list[Any], datatype: str) -> None:
    (tensor,) = decode({"inputs": values}).inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == (codec.DEFAULT_INPUT, datatype, (len(values),))


def test_the_only_input_takes_an_unnamed_value_and_a_fixed_shape_takes_one_instance() -> None:
    (tensor,) = decode({"instances": [[1, 2], [3, 4]]}, (TensorSpec("x", "FP64", (2, 2)),)).inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", "FP64", (2, 2))
    # one instance of a model without batch dimension
    (tensor,) = decode({"instances": [[[1, 2], [3, 4]]]}, (TensorSpec("x", "FP64", (2, 2)),)).inputs
    assert tensor.shape == (2, 2)


@pytest.mark.parametrize(("body", "specs", "kind", "words"), [
    ({"instances": [[1, 2], [3]]}, (), ErrorKind.INVALID_INPUT, "ragged"),
    ({"instances": [[1, [2]], [3, 4]]}, (), ErrorKind.INVALID_INPUT, "ragged"),
    ({"instances": [[[1]], [2]]}, (), ErrorKind.INVALID_INPUT, "ragged"),
    ({"instances": [1, "a"]}, (), ErrorKind.INVALID_INPUT, "all numbers"),
    ({"instances": [[1, 2]]}, SPECS, ErrorKind.INVALID_INPUT, "takes 2 inputs"),
    ({"instances": [{"a": [1, 2], "c": "x"}]}, SPECS, ErrorKind.INVALID_INPUT, "no input 'c'"),
    ({"instances": [{"a": [1, 2, 3], "b": "x"}]}, SPECS, ErrorKind.INVALID_INPUT, "do not fit"),
    ({"instances": [{"a": [1.5, 2], "b": "x"}]}, SPECS, ErrorKind.INVALID_INPUT, "INT32 data must be integers"),
    ({"instances": [{"a": [1, 2], "b": 3}]}, SPECS, ErrorKind.INVALID_INPUT, "BYTES values must be strings"),
    ({"instances": [{"b64": "a"}]}, (), ErrorKind.INVALID_INPUT, "not valid base64"),
    ({"instances": 1}, (), ErrorKind.MALFORMED_REQUEST, "non-empty list"),
    ({"inputs": 1, "instances": [1]}, (), ErrorKind.MALFORMED_REQUEST, "exactly one of"),
    ({"inputs": [1], "parameters": {"p": [1]}}, (), ErrorKind.INVALID_INPUT, "parameter 'p'"),
])
def test_refusals(body: Any, specs: tuple[TensorSpec, ...], kind: ErrorKind, words: str) -> None:
    error = refused(body, specs)
    assert error.kind is kind and words in error.message, error


def test_limits_hold_before_arrays_are_made() -> None:
    assert refused({"inputs": [0] * 11}, (), allowance(max_elements=10)).kind is ErrorKind.TOO_LARGE
    assert refused({"inputs": ["x" * 11]}, (), allowance(max_bytes_element=10)).kind is ErrorKind.TOO_LARGE
    deep: Any = 0
    for _ in range(40):
        deep = [deep]
    assert "nested more than" in refused({"inputs": deep}).message


def test_answers_rows_and_columns() -> None:
    out = Tensor.from_numpy("o", np.array([[1.0, np.nan], [3.0, 4.0]], dtype=np.float32))
    text = Tensor.from_numpy("t", np.array([b"ok", b"\xff"], dtype=object), "BYTES")
    assert orjson.loads(codec.encode_answer([out], 2)) == {"predictions": [[1.0, None], [3.0, 4.0]]}
    assert orjson.loads(codec.encode_answer([out, text], 2)) == {"predictions": [
        {"o": [1.0, None], "t": "ok"}, {"o": [3.0, 4.0], "t": {"b64": base64.b64encode(b"\xff").decode()}}]}
    assert orjson.loads(codec.encode_answer([out, text], None)) == {"outputs": {
        "o": [[1.0, None], [3.0, 4.0]], "t": ["ok", {"b64": "/w=="}]}}
    # a model without batch dimension answering one instance: the whole output is its entry
    assert orjson.loads(codec.encode_answer([out], 1)) == {"predictions": [[[1.0, None], [3.0, 4.0]]]}
    with pytest.raises(GatewayError) as info:
        codec.encode_answer([out], 3)
    assert info.value.kind is ErrorKind.UPSTREAM_BAD_RESPONSE
    bf16 = Tensor("h", "BF16", (1,), float_to_bf16(np.array([1.5])))
    scalar = Tensor("s", "INT64", (), np.array(7, dtype=np.int64))
    assert orjson.loads(codec.encode_answer([bf16, scalar], None)) == {"outputs": {"h": [1.5], "s": 7}}


def test_errors_both_ways() -> None:
    status, body = codec.encode_error(GatewayError(ErrorKind.MODEL_NOT_FOUND, "no model 'm'"))
    assert (status, orjson.loads(body)) == (404, {"error": "no model 'm'"})
    assert upstream_codec.decode_error(422, b'{"error": "bad shape"}', "u").kind is ErrorKind.INVALID_INPUT
    assert upstream_codec.decode_error(500, b"<html>", "u").kind is ErrorKind.UPSTREAM_BAD_RESPONSE
    assert "bad shape" in upstream_codec.decode_error(400, b'{"error": "bad shape"}', "u").message
