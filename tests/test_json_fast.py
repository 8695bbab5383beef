"""The fast JSON reader (gateway/core/tensors.py, read_json_fast) against orjson:
for any body, decoding with it gives the same tensors, bit for bit, or the
same error as decoding with orjson alone. The size threshold is lowered
so that small generated bodies take the fast path."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_codec_properties import Pairs, bodies, hostile_v2_json

from gateway.config.limits import Limits
from gateway.core import tensors
from gateway.core.errors import ErrorKind, GatewayError
from gateway.core.types import DATATYPES
from gateway.protocols.v2_rest import codec

LIMITS = Limits()
MAX = LIMITS.max_tensor_elements
EQUAL = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Raw(str):
    """A JSON token written as is (numbers as clients may write them)."""


def text_of(value: Any) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Pairs):
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{text_of(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(text_of(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


@pytest.fixture(autouse=True)
def fast_for_small_bodies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensors, "FAST_JSON_MIN_BYTES", 0)


def outcome(body: bytes, response: bool = False) -> Any:
    """What decoding ``body`` gives, comparable with ==: the tensors' bytes
    (NaN included), or the error."""
    try:
        if response:
            decoded = codec.decode_infer_response(body, None, MAX)
            found, extra = decoded.outputs, (decoded.model_name, decoded.id, decoded.parameters)
        else:
            request = codec.decode_infer_request(body, None, "m", "", MAX, LIMITS, keep_raw=True)
            found, extra = request.inputs, (request.raw is not None, request.id, request.parameters,
                                            [(o.name, o.parameters) for o in request.outputs])
    except Exception as error:  # the same failure either way, whatever it is
        return type(error).__name__, str(error)
    return [(t.name, t.datatype, t.shape, t.data.dtype.str, t.parameters,
             t.data.tolist() if t.data.dtype.kind == "O" else t.data.tobytes()) for t in found], extra


class Reads:
    """Which texts the fast reader took."""

    def __init__(self) -> None:
        self.taken = 0


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    counter = Reads()
    original = tensors.read_json_fast

    def counted(*args: Any, **kwargs: Any) -> Any:
        value = original(*args, **kwargs)
        counter.taken += value is not None
        return value
    monkeypatch.setattr(tensors, "read_json_fast", counted)
    yield counter


def both_ways(body: bytes, response: bool = False) -> tuple[Any, Any]:
    fast = outcome(body, response)
    saved = tensors.FAST_JSON_MIN_BYTES
    tensors.FAST_JSON_MIN_BYTES = 1 << 62
    try:
        return fast, outcome(body, response)
    finally:
        tensors.FAST_JSON_MIN_BYTES = saved


# --- numbers as clients write them ----------------------------------------------------------

NUMBER_TOKENS = st.sampled_from([
    "0", "-0", "1", "-1", "0.5", "-0.0", "1e5", "1E-5", "1e-400", "1e400", "-1e400", "2.5e38", "3.5e38",
    "127", "128", "-129", "255", "256", "32768", "65535", "65536", "2147483648", "4294967296",
    "9007199254740993", "-9007199254740993", "9223372036854775807", "9223372036854775808",
    "-9223372036854775808", "-9223372036854775809", "18446744073709551615", "18446744073709551616",
    "123456789012345678901234567890", "0.1000000000000000055511151231257827021181583404541015625",
    "2.2250738585072011e-308", "4.9e-324", "1.7976931348623157e308", "1.0", "1.", ".5", "01", "+1",
    "true", "false", "null", '"1"', "NaN", "Infinity", "[]", "{}", "[1]"]).map(Raw)
LEAVES = st.one_of(NUMBER_TOKENS, st.integers(-(2 ** 65), 2 ** 65).map(lambda n: Raw(str(n))),
                   st.floats(allow_nan=False, allow_infinity=False).map(lambda x: Raw(repr(x))),
                   st.floats(width=32, allow_nan=False, allow_infinity=False).map(
                       lambda x: Raw(orjson.dumps(np.float32(x), option=orjson.OPT_SERIALIZE_NUMPY).decode())))


@st.composite
def numeric_data(draw: st.DrawFn) -> tuple[Any, list[int]]:
    """Flat or nested lists of mostly one kind of number, sometimes ragged or
    with a list where a number belongs; and the shape they fill."""
    leaf = draw(st.one_of(LEAVES, st.just(None)))
    def element() -> Any:
        return leaf if leaf is not None and draw(st.integers(0, 5)) else draw(LEAVES)
    dims = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))

    def build(level: int) -> Any:
        if level == len(dims):
            return element()
        return [build(level + 1) for _ in range(dims[level])]
    data = build(0)
    if draw(st.integers(0, 3)) == 0 and dims[0]:  # break it: ragged rows, or a list among the numbers
        flat = data
        while isinstance(flat[0], list) and flat[0]:
            flat = flat[0]
        choice = draw(st.integers(0, 2))
        if choice == 0:
            flat.append(element())
        elif choice == 1:
            flat[-1] = [flat[-1]]
        else:
            data.append(data[0] if not isinstance(data[0], list) else data[0][:-1])
    shape = draw(st.one_of(st.just(dims), st.lists(st.integers(0, 5), max_size=3)))
    return data, shape


@st.composite
def numeric_body(draw: st.DrawFn) -> Pairs:
    data, shape = draw(numeric_data())
    datatype = draw(st.sampled_from([*sorted(DATATYPES), "X"]))
    tensor = Pairs([("name", "x"), ("datatype", datatype), ("shape", shape), ("data", data)])
    top = [("inputs", [tensor]), ("outputs", [tensor])]
    if draw(st.booleans()):
        top.insert(0, ("id", draw(st.sampled_from(["a[b", "a", "[[[", "é", "\u2028"]))))
    return Pairs(top)


@EQUAL
@given(numeric_body())
@example(Pairs([("inputs", [Pairs([("name", "x"), ("datatype", "FP32"), ("shape", [3]),
                                    ("data", [Raw("1"), [Raw("2")], Raw("3")])])])]))
@example(Pairs([("inputs", [Pairs([("name", "x"), ("datatype", "FP32"), ("shape", [2, 2]),
                                    ("data", [[Raw("1"), [Raw("2")]], [Raw("3"), Raw("4")]])])])]))
@example(Pairs([("inputs", [Pairs([("name", "x"), ("datatype", "FP32"), ("shape", [2]),
                                    ("data", [Raw(str(2 ** 60 + 2 ** 36 + 1)), Raw("1")])])])]))
def test_numbers_decode_as_orjson_reads_them(body: Pairs) -> None:
    text = text_of(body).encode()
    fast, reference = both_ways(text)
    assert fast == reference
    fast, reference = both_ways(text, response=True)
    assert fast == reference


@EQUAL
@given(hostile_v2_json())
def test_hostile_bodies_decode_as_orjson_reads_them(body: Pairs) -> None:
    for text in bodies(body):
        for response in (False, True):
            fast, reference = both_ways(text, response)
            assert fast == reference


# --- which texts the fast reader takes ---------------------------------------------------------

def body_of(datatype: str, data: Any, shape: list[int], **extra: Any) -> bytes:
    return orjson.dumps({**extra, "inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": data}]},
                        option=orjson.OPT_SERIALIZE_NUMPY)


@pytest.mark.parametrize(("datatype", "data", "shape"), [
    ("FP32", np.random.default_rng(1).random(100, dtype=np.float32), [100]),
    ("FP64", np.random.default_rng(2).normal(size=(4, 25)), [4, 25]),
    ("FP16", [[1, 2.5], [3, 4]], [2, 2]),
    ("BF16", [1.5, -2], [2]),
    ("INT8", list(range(-128, 128)), [256]),
    ("UINT64", [0, 2 ** 64 - 1, 2 ** 63], [3]),
    ("INT64", [[-(2 ** 63), 2 ** 63 - 1]] * 3, [3, 2]),
    ("UINT8", [], [0]),
])
def test_numeric_tensors_are_read_fast(reads: Reads, datatype: str, data: Any, shape: list[int]) -> None:
    fast, reference = both_ways(body_of(datatype, data, shape))
    assert fast == reference and isinstance(fast, tuple) and isinstance(fast[0], list)
    assert reads.taken == 1


@pytest.mark.parametrize("body", [
    b"\xef\xbb\xbf" + body_of("FP32", [1.0, 2.0], [2]),  # a byte-order mark: orjson refuses it
    body_of("FP32", [1.0, 2.0], [2], id="a\\b"),  # an escape
    body_of("BYTES", ["a"] * 3000, [3000]),  # many strings
    b'{"inputs": [], "inputs": []}',  # a key given twice
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1, [2]]}]}',  # a list among numbers
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2]}], "x": 1' + b"0" * 30 + b"}",
    b"[1, 2]",
])
def test_texts_left_to_orjson(reads: Reads, body: bytes) -> None:
    fast, reference = both_ways(body)
    assert fast == reference
    assert reads.taken == 0


def test_many_short_rows_are_left_to_orjson(reads: Reads, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = body_of("INT32", [[1, 2, 3]] * 8, [8, 3])
    monkeypatch.setattr(tensors, "_FAST_JSON_MAX_ROWS", 4)
    fast, reference = both_ways(rows)  # parsed, then left: checking each row would cost more than it saves
    assert fast == reference and reads.taken == 0
    long_rows = body_of("INT32", [list(range(1000, 1032))] * 8, [8, 32])
    fast, reference = both_ways(long_rows)
    assert fast == reference and reads.taken == 1
    monkeypatch.setattr(tensors, "_FAST_JSON_MANY_ARRAYS", 4)
    assert tensors._text_profile(rows) is None  # not even parsed: few bytes per list
    assert tensors._text_profile(long_rows) is not None


def test_the_parser_is_charged_before_it_parses() -> None:
    charged: list[int] = []
    body = body_of("FP32", [1.0] * 8, [8], id="abc")
    codec.decode_infer_request(body, None, "m", "", MAX, LIMITS, charge=charged.append)
    strings = re.findall(rb'"([^"]*)"', body)
    assert charged == [len(body) + sum(map(len, strings))]  # its copy of the text, and of the strings


def test_a_parser_left_with_live_proxies_is_replaced() -> None:
    """A parse while proxies of the thread's parser are alive fails in
    simdjson: that text goes to orjson and the thread gets a new parser."""
    parser = tensors._kept_parser()
    alive = parser.parse(b"[1, 2]")
    body = body_of("FP32", [1.0, 2.0], [2])
    request = codec.decode_infer_request(body, None, "m", "", MAX, LIMITS)
    assert request.inputs[0].data.tolist() == [1.0, 2.0]
    assert tensors._kept_parser() is not parser
    del alive
    assert tensors.read_json_fast(body, tensors.plain) is not None


# Values at each datatype's edges, and what no datatype takes.
_EDGE_VALUES = [0, 1, -1, 127, 128, -129, 255, 256, 2 ** 31, -(2 ** 31) - 1, 2 ** 32, 2 ** 53, 2 ** 53 + 1,
                2 ** 63 - 1, 2 ** 63, -(2 ** 63) - 1, 2 ** 64, 0.5, -0.0, 16777217.0, 3.4028235e38, 3.4028236e38,
                1e308, float("nan"), float("inf"), True, False, None, "1"]


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(DATATYPES - {"BYTES"})),
       st.lists(st.one_of(st.sampled_from(_EDGE_VALUES), st.integers(), st.floats()), min_size=1, max_size=6))
def test_small_lists_are_checked_as_numpy_checks_them(datatype: str, data: list[Any]) -> None:
    """Small flat lists take a check without numpy's reductions: the same
    array, bit for bit, or the same error as the general path; checked only
    (an answer relayed as its bytes), they pass or fail alike."""
    def read(small_max: int, reader: Any = tensors.array_from_json) -> Any:
        original = tensors._SMALL_LIST_MAX
        tensors._SMALL_LIST_MAX = small_max
        try:
            array = reader(data, datatype, (len(data),), len(data), "input 'x'")
            return array.dtype, array.shape, array.tobytes()
        except GatewayError as error:
            return error.kind, error.message
        finally:
            tensors._SMALL_LIST_MAX = original

    general = read(0)
    assert read(1024) == general
    checked = read(1024, tensors.check_json_data)
    assert checked == general or (checked[0] == general[0] and not isinstance(general[0], ErrorKind))
