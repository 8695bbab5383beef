"""Tensor data in the forms every protocol shares, with no protocol's names.

JSON: a tensor's elements as a flat or nested (row-major) JSON list.
Binary: raw little-endian bytes, read as zero-copy numpy views; BYTES
elements each a uint32 little-endian length followed by the bytes (the
layout of Triton's binary extension and of KServe gRPC's raw contents).
BF16 travels as its 16-bit patterns in a uint16 array.

Big JSON texts are read by :func:`read_json_fast`: numeric lists straight
into numpy (:class:`JsonNumbers`), without a Python object per element.
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import numpy as np
import orjson
import simdjson

from gateway.core.errors import invalid, malformed, too_large
from gateway.core.limits import BYTES_PREFIX, TensorAllowance, whole_bytes
from gateway.core.types import ELEMENT_SIZE, NUMPY_DTYPES, Tensor, element_count

_INT_KINDS = "iu"
# Integers from here on are beyond every 64-bit type (negative: from -2**63 - 1).
_INT64_END = 2.0 ** 63
# The largest finite value of each binary float datatype (BF16 shares FP32's exponent).
_FLOAT_MAX: dict[str, float] = {"FP16": float(np.finfo(np.float16).max), "FP32": float(np.finfo(np.float32).max),
                                "BF16": 3.3895314e38}
# Each integer datatype's range (np.iinfo is slow to build per tensor).
_INT_RANGES: dict[str, tuple[int, int]] = {
    name: (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
    for name, dtype in NUMPY_DTYPES.items() if dtype.kind in _INT_KINDS and name != "BF16"}
# Small flat lists of plain numbers are checked element-wise in C (types,
# min, max) instead of through numpy's reductions, where those dominate.
_SMALL_LIST_MAX = 1024
# Each integer datatype's range within int64's (numpy reads such a list as int64), and its dtype.
_SMALL_INT_RANGES: dict[str, tuple[int, int, np.dtype[Any]]] = {
    name: (max(low, -(2 ** 63)), min(high, 2 ** 63 - 1), NUMPY_DTYPES[name])
    for name, (low, high) in _INT_RANGES.items()}
_FLOAT64 = np.dtype(np.float64)
_EXACT_FLOAT_INT = 2 ** 53  # integers up to this are the same as a double
_PLAIN_FLOAT_TYPES = ({float}, {int}, {int, float})


# --- tensor data: JSON ------------------------------------------------------


def _flatten(data: list[Any], out: list[Any]) -> None:
    """Row-major leaves of nested lists; iterative, so any nesting is safe."""
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()


def _bytes_from_json(data: list[Any], where: str) -> list[bytes]:
    flat: list[Any] = []
    _flatten(data, flat)
    try:
        return [item.encode() for item in flat]
    except AttributeError:
        bad = next(item for item in flat if not isinstance(item, str))
        raise invalid(f"{where}: BYTES data must be strings, got {type(bad).__name__}") from None


def float_to_bf16(values: np.ndarray) -> np.ndarray:
    """float -> bfloat16 bit patterns, rounding to nearest even (NaN kept)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    rounded = np.where(np.isnan(values.astype(np.float32)), (bits >> 16) | 0x40, rounded)
    return rounded.astype(np.uint16)


def bf16_to_float(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _json_leaf_count(data: Any) -> int:
    """Elements of JSON ``data``, flat or nested, following the first
    element of each level (ragged data is caught later, when parsed)."""
    if isinstance(data, JsonNumbers):
        return int(data.values.size)
    if not isinstance(data, list):
        return 1
    if data and isinstance(data[0], list):
        return sum(_json_leaf_count(row) for row in data)
    return len(data)


def check_json_count(data: list[Any] | JsonNumbers, shape: list[Any], where: str) -> None:
    """Raise the shape-versus-data error when ``data`` does not fill ``shape``."""
    needed = element_count(shape, where)
    held = _json_leaf_count(data)
    if held != needed:
        raise invalid(f"{where}: has {held} data elements but shape {list(shape)} needs {needed}")


def array_from_json(data: Any, datatype: str, shape: tuple[int, ...], count: int, where: str,
                    allowance: TensorAllowance | None = None) -> np.ndarray:
    """JSON ``data`` (flat or nested, row-major, or read by
    :func:`read_json_fast`) as an array of ``shape``."""
    if isinstance(data, JsonNumbers):  # what np.array(data) gives, already made
        return _checked_numbers(data.values.reshape(data.shape), data, datatype, shape, count, where)
    if not isinstance(data, list):
        raise malformed(f"{where}: 'data' must be a list")
    if datatype == "BYTES":
        items = _bytes_from_json(data, where)
        if len(items) != count:
            raise invalid(f"{where}: has {len(items)} data elements but shape {list(shape)} needs {count}")
        if allowance is not None:
            allowance.claim_bytes_items(items, where)
        array = np.empty(count, dtype=object)
        array[:] = items
        return array.reshape(shape)
    if 0 < count == len(data) <= _SMALL_LIST_MAX and _plainly_valid(data, datatype):
        return _small_array(data, datatype).reshape(shape)
    try:
        parsed = np.array(data)
    except (ValueError, OverflowError):
        raise invalid(f"{where}: 'data' is not a regular (non-ragged) list of numbers") from None
    return _checked_numbers(parsed, data, datatype, shape, count, where)


def check_json_data(data: Any, datatype: str, shape: tuple[int, ...], count: int, where: str,
                    allowance: TensorAllowance | None = None) -> np.ndarray:
    """:func:`array_from_json`'s checks and errors, for data that is only
    checked: a small list plainly valid for ``datatype`` is not made an
    array, an empty one of its dtype stands for it."""
    if (isinstance(data, list) and 0 < count == len(data) <= _SMALL_LIST_MAX and datatype != "BYTES"
            and _plainly_valid(data, datatype)):
        return np.empty(0, dtype=NUMPY_DTYPES[datatype])
    return array_from_json(data, datatype, shape, count, where, allowance)


def _plainly_valid(data: list[Any], datatype: str) -> bool:
    """Whether every element of a flat list is plainly valid for
    ``datatype``, so that :func:`_small_array` makes the array
    :func:`_checked_numbers` would make of it. False leaves the list,
    errors included, to the general path."""
    types = set(map(type, data))
    integers = _SMALL_INT_RANGES.get(datatype)
    if integers is not None:
        return types == {int} and min(data) >= integers[0] and max(data) <= integers[1]
    if datatype == "BOOL":
        return types == {bool}
    if datatype not in ("FP32", "FP64") or types not in _PLAIN_FLOAT_TYPES:
        return False
    if int in types and not -_EXACT_FLOAT_INT <= min(data) <= max(data) <= _EXACT_FLOAT_INT:
        return False  # numpy reads big integers otherwise (object, or int64 rounded on the way)
    if float in types and not math.isfinite(sum(data)):
        return False  # NaN, an infinity, or sums too big to tell: min and max below need neither
    largest = _FLOAT_MAX.get(datatype, math.inf)
    return min(data) >= -largest and max(data) <= largest


def _small_array(data: list[Any], datatype: str) -> np.ndarray:
    integers = _SMALL_INT_RANGES.get(datatype)
    if integers is not None:
        return np.array(data, dtype=integers[2])
    if datatype == "BOOL":
        return np.array(data, dtype=np.bool_)
    return np.array(data, dtype=_FLOAT64).astype(NUMPY_DTYPES[datatype], copy=False)


def _checked_numbers(parsed: np.ndarray, data: Any, datatype: str, shape: tuple[int, ...], count: int,
                     where: str) -> np.ndarray:
    """``parsed`` (numpy's reading of JSON ``data``) checked against the
    datatype and shape, as an array of ``shape``."""
    if parsed.size != count:
        raise invalid(f"{where}: has {parsed.size} data elements but shape {list(shape)} needs {count}")
    if count == 0:
        return np.zeros(shape, dtype=NUMPY_DTYPES[datatype])
    kind = parsed.dtype.kind
    if datatype == "BOOL":
        if kind != "b":
            raise invalid(f"{where}: BOOL data must be true/false")
    elif datatype in ("FP16", "FP32", "FP64", "BF16"):
        if kind == "O":  # null is NaN: what MLServer and this gateway write for non-finite values
            parsed = _floats_with_nulls(data, datatype, where)
            kind = "f"
        if kind not in "fiu":
            raise invalid(f"{where}: {datatype} data must be numbers")
        return _floats(parsed, datatype, where).reshape(shape)
    else:
        if kind == "f" and datatype == "UINT64":
            # numpy infers float64 for ints above int64's range: redo exactly
            parsed = _uint64_from_json(data, shape, where)
            kind = parsed.dtype.kind
        if kind == "f" and _integral_beyond(parsed, _INT64_END):
            raise invalid(f"{where}: a value is out of range for {datatype}")  # orjson's float for a big integer
        if kind not in _INT_KINDS:
            raise invalid(f"{where}: {datatype} data must be integers")
        low, high = _INT_RANGES[datatype]
        if parsed.min() < low or parsed.max() > high:
            raise invalid(f"{where}: a value is out of range for {datatype}")
    return parsed.astype(NUMPY_DTYPES[datatype], copy=False).reshape(shape)


def _integral_beyond(values: np.ndarray, bound: float) -> bool:
    """Whether every value is integral and one's magnitude reaches ``bound``."""
    with np.errstate(invalid="ignore"):
        return bool(np.abs(values).max() >= bound) and bool((np.floor(values) == values).all())


def _floats(parsed: np.ndarray, datatype: str, where: str) -> np.ndarray:
    """Numbers as ``datatype``, rounded to nearest; a finite number beyond
    its largest finite value is out of range (never infinity)."""
    if datatype == "FP64":
        return parsed.astype(np.float64, copy=False)
    largest = _FLOAT_MAX[datatype]
    if parsed.max() <= largest and parsed.min() >= -largest:  # the usual case: nothing can overflow
        return float_to_bf16(parsed) if datatype == "BF16" else parsed.astype(NUMPY_DTYPES[datatype], copy=False)
    with np.errstate(over="ignore", invalid="ignore"):  # NaN, infinities, or values near or past the largest
        if datatype == "BF16":
            result = float_to_bf16(parsed.astype(np.float64))
            overflow = (result & 0x7FFF) == 0x7F80  # infinity's pattern
        else:
            result = parsed.astype(NUMPY_DTYPES[datatype], copy=False)
            overflow = np.isinf(result)
    if overflow.any() and np.isfinite(parsed[overflow]).any():
        raise invalid(f"{where}: a value is out of range for {datatype} (its largest magnitude is "
                      f"{_FLOAT_MAX[datatype]:.4g})")
    return result


def _floats_with_nulls(data: list[Any], datatype: str, where: str) -> np.ndarray:
    flat: list[Any] = []
    _flatten(data, flat)
    if not all(type(item) in (int, float, type(None)) for item in flat):
        raise invalid(f"{where}: {datatype} data must be numbers")
    return np.array([np.nan if item is None else item for item in flat], dtype=np.float64)


def _uint64_from_json(data: list[Any], shape: tuple[int, ...], where: str) -> np.ndarray:
    flat: list[Any] = []
    _flatten(data, flat)
    if not all(type(item) is int for item in flat):
        # orjson reads integers past 2**64 as floats: name the real problem
        if all(type(item) is int or (type(item) is float and item >= 2.0 ** 64) for item in flat):
            raise invalid(f"{where}: a value is out of range for UINT64")
        raise invalid(f"{where}: UINT64 data must be integers")
    try:
        return np.array(flat, dtype=np.uint64)
    except OverflowError:
        raise invalid(f"{where}: a value is out of range for UINT64") from None


def written_as_integers(numbers: list[Any], text: bytes | bytearray | memoryview,
                        charge: Callable[[int], None] | None = None) -> bool:
    """Whether JSON numbers, as orjson read them from ``text``, were all
    written as integers. orjson reads an integer beyond 64 bits as a float,
    so a value's datatype read from its JSON would be a float one; only the
    text tells ``123456789012345678901234567890`` from ``1.2345678901234568e29``,
    and it is asked only when every float is beyond 64 bits (rare)."""
    beyond = False
    for number in numbers:  # stops at the first float a JSON float literal could be
        if type(number) is not int:
            if not abs(number) >= _INT64_END:
                return False
            beyond = True
    return not beyond or holds_big_integers(text, charge)


def holds_big_integers(text: bytes | bytearray | memoryview, charge: Callable[[int], None] | None = None) -> bool:
    """Whether JSON ``text`` holds an integer literal beyond 64 bits
    (simdjson refuses those by name; strings are no literals to it).
    ``charge`` takes the parser's padded copy of the text before it is made."""
    if charge is not None:
        charge(len(text))
    try:
        simdjson.Parser().parse(whole_bytes(text))
    except (RuntimeError, ValueError) as exc:
        return "BIGINT" in str(exc)
    return False


def array_to_json(tensor: Tensor) -> Any:
    """Flat, row-major JSON-serializable data for ``tensor``."""
    if tensor.datatype == "BYTES":
        try:
            return [item.decode() for item in tensor.data.reshape(-1)]
        except UnicodeDecodeError:
            raise invalid(f"output '{tensor.name}' holds non-UTF-8 bytes that JSON cannot carry; "
                          "request it with binary_data: true") from None
    if tensor.datatype == "BF16":
        return bf16_to_float(tensor.data.reshape(-1))
    return np.ascontiguousarray(tensor.data).reshape(-1)


# --- tensor data: binary ----------------------------------------------------


def array_from_raw(buffer: memoryview, datatype: str, shape: tuple[int, ...], count: int, where: str,
                   allowance: TensorAllowance | None = None) -> np.ndarray:
    """Raw little-endian bytes (zero-copy view) or length-prefixed BYTES."""
    if datatype == "BYTES":
        if allowance is not None:  # the prefixes were claimed with the shape; now the payload
            allowance.add_bytes(max(0, len(buffer) - BYTES_PREFIX * count), where)
        return bytes_from_raw(buffer, shape, count, where, allowance.max_bytes_element if allowance else None)
    expected = count * ELEMENT_SIZE[datatype]
    if len(buffer) != expected:
        raise invalid(f"{where}: has {len(buffer)} bytes of data but shape {list(shape)} of "
                      f"{datatype} needs {expected}")
    return np.frombuffer(buffer, dtype=NUMPY_DTYPES[datatype]).reshape(shape)


# BYTES elements made or stored per numpy call: each call holds the GIL, so
# it stays well under a millisecond long.
_UNIFORM_CHUNK = 1 << 16


def _uniform_bytes(buffer: memoryview, count: int) -> np.ndarray | None:
    """BYTES elements that all have the first one's length, made by numpy
    (six times faster than one at a time); None when they do not."""
    if count == 0 or len(buffer) < 4:
        return None
    length = int.from_bytes(buffer[:4], "little")
    stride = 4 + length
    if stride * count != len(buffer):
        return None
    prefixes = np.ndarray((count,), dtype="<u4", buffer=buffer, strides=(stride,))
    if not bool((prefixes == length).all()):
        return None
    array = np.empty(count, dtype=object)
    if length == 0:
        array[:] = b""
        return array
    payloads = np.ndarray((count,), dtype=f"V{length}", buffer=buffer, offset=4, strides=(stride,))
    for start in range(0, count, _UNIFORM_CHUNK):  # void items become bytes, trailing NULs kept
        array[start:start + _UNIFORM_CHUNK] = payloads[start:start + _UNIFORM_CHUNK].astype(object)
    return array


def bytes_from_raw(buffer: memoryview, shape: tuple[int, ...], count: int, where: str,
                   max_element: int | None = None) -> np.ndarray:
    uniform = _uniform_bytes(buffer, count)
    if uniform is not None:
        length = len(buffer) // count - 4
        if max_element is not None and length > max_element:
            raise too_large(f"{where}: a BYTES element of {length} bytes is over limits.max_bytes_element "
                            f"({max_element})")
        return uniform.reshape(shape)
    items: list[bytes] = [b""] * count
    offset, end = 0, len(buffer)
    ceiling = end if max_element is None else min(end, max_element)
    unpack = struct.Struct("<I").unpack_from
    for index in range(count):
        if offset + 4 > end:
            if offset == end:
                raise invalid(f"{where}: has {index} BYTES elements but shape {list(shape)} needs {count}")
            raise invalid(f"{where}: BYTES data ends inside a length prefix")
        (length,) = unpack(buffer, offset)
        start = offset + 4
        offset = start + length
        if length > ceiling or offset > end:
            if max_element is not None and length > max_element:
                raise too_large(f"{where}: a BYTES element of {length} bytes is over limits.max_bytes_element "
                                f"({max_element})")
            raise invalid(f"{where}: BYTES element length {length} overruns the data")
        items[index] = buffer[start:offset].tobytes()
    if offset != end:
        raise invalid(f"{where}: has more BYTES elements than shape {list(shape)} holds")
    array = np.empty(count, dtype=object)
    for start in range(0, count, _UNIFORM_CHUNK):  # each step holds the GIL: keep it short
        array[start:start + _UNIFORM_CHUNK] = items[start:start + _UNIFORM_CHUNK]
    return array.reshape(shape)


def bytes_to_raw(array: np.ndarray) -> bytes:
    flat = array.reshape(-1)
    parts: list[bytes] = []
    pack = struct.Struct("<I").pack
    for item in flat:
        parts.append(pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def array_to_raw(tensor: Tensor) -> bytes | memoryview:
    if tensor.datatype == "BYTES":
        return bytes_to_raw(tensor.data)
    data = np.ascontiguousarray(tensor.data, dtype=NUMPY_DTYPES[tensor.datatype])
    return memoryview(data.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # also for empty tensors


# --- big JSON texts: numbers straight into numpy -----------------------------
#
# orjson builds a Python float per JSON number and numpy then copies them
# (~40 + 13 ms for a million). simdjson (pysimdjson) parses the same text
# into its own tape in ~11 ms and copies a numeric list out as doubles or
# 64-bit integers with no Python object per element. It is used only where
# it gives exactly what orjson gives; everything else, and every error,
# goes to orjson as before (docs/performance.md, "JSON").

# Smaller texts are read by orjson alone: as fast, and no parser to set up.
FAST_JSON_MIN_BYTES = 64 << 10
# Texts up to this size are parsed by a parser kept per thread, whose
# buffers (~3 times the largest text it read) stay allocated; bigger ones by
# a parser made and freed for them (~10 ms more for 10 MB, in page faults),
# so that no pool thread keeps a big body's worth of memory when idle.
_KEPT_PARSER_MAX_BYTES = 1 << 20
# Quotes in a text the fast reader takes: a text of more strings gains
# nothing from it (strings become Python objects either way).
_FAST_JSON_MAX_QUOTES = 4096
# Nested lists are read fast when they have few rows, or rows of this many
# numbers or more: each row is visited once (~0.3 us) to check that the
# nesting is regular, which pays off against orjson's ~50 ns per number.
_FAST_JSON_MAX_ROWS = 4096
_FAST_JSON_MIN_ROW = 16
# A text of more lists than this, with fewer bytes per list than the
# other, holds many short rows: orjson reads it without a wasted parse.
_FAST_JSON_MANY_ARRAYS = 4096
_FAST_JSON_MIN_BYTES_PER_ARRAY = 64
_BOM = b"\xef\xbb\xbf"  # simdjson skips it, orjson refuses it
_QUOTE, _OPEN_ARRAY = ord('"'), ord("[")
_PROFILE_CHUNK = 1 << 20  # bytes compared per numpy call: memory stays a few chunks

_BufferType = Literal["d", "i", "u"]
# A datatype's numbers as simdjson copies them out: what np.array makes of
# the same JSON numbers (float64, int64) unless a value does not fit.
_BUFFER_TYPES: dict[str, _BufferType] = {
    **dict.fromkeys(("FP16", "FP32", "FP64", "BF16"), "d"),
    **dict.fromkeys(("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32"), "i"),
    "UINT64": "u",
}
_BUFFER_DTYPES = {"d": np.float64, "i": np.int64, "u": np.uint64}
# Integers from 2**53 on are not all doubles: np.array keeps an all-integer
# list as int64 and rounds once to FP32, simdjson's doubles would round twice.
_EXACT_DOUBLE_INTEGERS = 2.0 ** 53

T = TypeVar("T")
_threads = threading.local()


class JsonNumbers:
    """A JSON list of numbers (flat, or nested and regular) read into
    numpy: its values, row-major, as float64, int64 or uint64, the shape of
    its nesting, and how many JSON lists it was written as."""

    __slots__ = ("arrays", "shape", "values")

    def __init__(self, values: np.ndarray, shape: tuple[int, ...], arrays: int) -> None:
        self.values = values
        self.shape = shape
        self.arrays = arrays


class NotFast(Exception):
    """The fast reader cannot vouch for giving what orjson gives."""


def read_json_fast(text: bytes | bytearray | memoryview, convert: Callable[[Any], T],
                   charge: Callable[[int], None] | None = None) -> T | None:
    """``convert`` of ``text`` parsed by simdjson, or None: the text is not
    one the fast reader takes, simdjson refuses it, or ``convert`` raises
    :class:`NotFast`. The caller then reads it with orjson, whose values and
    errors are the reference.

    ``convert`` gets the parsed document as simdjson's proxies and must turn
    all of it into Python values with :func:`json_fields`, :func:`plain` and
    :func:`json_numbers` (no proxy may outlive the call). ``charge`` takes
    what the parser needs beyond what parsing is charged per value (its
    padded copy of the text and of its strings), before it is allocated.
    """
    raw = whole_bytes(text)
    profile = _text_profile(raw)
    if profile is None:
        return None
    brackets, string_bytes = profile
    if charge is not None:
        charge(len(raw) + string_bytes)
    kept = len(raw) <= _KEPT_PARSER_MAX_BYTES
    parser = _kept_parser() if kept else simdjson.Parser()
    try:
        value = convert(parser.parse(raw))
    except RuntimeError:  # nesting past simdjson's 1024, or proxies left alive by a failed call: a new parser
        if kept:
            _threads.parser = None
        return None
    except (NotFast, ValueError, TypeError, KeyError, IndexError):  # simdjson refused the text, or a value
        return None
    return value if _brackets_add_up(value, brackets) else None


def _kept_parser() -> simdjson.Parser:
    parser: simdjson.Parser | None = getattr(_threads, "parser", None)
    if parser is None:
        parser = _threads.parser = simdjson.Parser()
    return parser


def _text_profile(text: bytes | bytearray) -> tuple[int, int] | None:
    """A text's opening brackets and the bytes inside its strings, or None
    when the fast reader leaves it to orjson: a byte-order mark, any escape
    (so every quote delimits a string and every bracket in a string is
    written as itself), many strings, or many short lists. numpy a chunk at
    a time."""
    if text[:3] == _BOM or text.find(b"\\") != -1:
        return None
    view = np.frombuffer(text, dtype=np.uint8)
    brackets = 0
    quotes: list[np.ndarray] = []
    held = 0
    for start in range(0, len(view), _PROFILE_CHUNK):
        chunk = view[start:start + _PROFILE_CHUNK]
        brackets += int(np.count_nonzero(chunk == _OPEN_ARRAY))
        found = np.flatnonzero(chunk == _QUOTE)
        held += len(found)
        if held > _FAST_JSON_MAX_QUOTES:
            return None
        quotes.append(found + start)
    if brackets > _FAST_JSON_MANY_ARRAYS and len(text) < brackets * _FAST_JSON_MIN_BYTES_PER_ARRAY:
        return None
    positions = np.concatenate(quotes) if quotes else np.zeros(0, np.intp)
    if len(positions) % 2:
        return None  # not JSON: orjson says why
    return brackets, int((positions[1::2] - positions[::2] - 1).sum())


def _brackets_add_up(value: Any, brackets: int) -> bool:
    """Whether the text's ``brackets`` are exactly the lists of ``value``
    (and the ``[`` in its strings) plus those each JsonNumbers was read from.
    A list the shape check could not see (a list where a row held a
    number) adds one, and the value is read again by orjson."""
    numbered = 0

    def as_null(item: Any) -> None:
        nonlocal numbered
        if not isinstance(item, JsonNumbers):
            raise TypeError
        numbered += item.arrays

    try:
        skeleton = orjson.dumps(value, default=as_null)
    except orjson.JSONEncodeError:  # e.g. nested deeper than orjson writes
        return False
    return skeleton.count(b"[") + numbered == brackets


def json_fields(value: Any) -> dict[str, Any]:
    """A JSON object's fields as simdjson proxies and values. NotFast when
    it is not an object, or when a lookup by key would not find what
    orjson keeps: a key given twice (orjson keeps the last) or holding NUL."""
    if not isinstance(value, simdjson.Object):
        raise NotFast
    keys = list(value)
    if len(set(keys)) != len(keys) or any("\0" in key for key in keys):
        raise NotFast
    return {key: value[key] for key in keys}


def is_json_object(value: Any) -> bool:
    return isinstance(value, simdjson.Object)


def is_json_array(value: Any) -> bool:
    return isinstance(value, simdjson.Array)


def plain(value: Any) -> Any:
    """A parsed JSON value as Python objects (orjson's: the last of
    repeated keys wins)."""
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def tensor_data(value: Any, datatype: str) -> Any:
    """A tensor's parsed JSON data: :class:`JsonNumbers` for a numeric
    datatype, plain values for the others (BOOL, BYTES, unknown names).
    NotFast when numeric data cannot be read into numpy: orjson then reads
    the whole text, which costs no more for such data."""
    if datatype not in _BUFFER_TYPES:
        return plain(value)
    numbers = json_numbers(value, datatype)
    if numbers is None:
        raise NotFast
    return numbers


def json_numbers(value: Any, datatype: str) -> JsonNumbers | None:
    """A parsed JSON list of ``datatype`` numbers as :class:`JsonNumbers`,
    or None when it is not one that can be read so: not numbers, nested
    irregularly or in many short rows, or values np.array reads otherwise."""
    of_type = _BUFFER_TYPES.get(datatype)
    if of_type is None or not isinstance(value, simdjson.Array):
        return None
    shape = [len(value)]
    first: Any = value
    while len(first):
        first = first[0]
        if not isinstance(first, simdjson.Array):
            break
        shape.append(len(first))
    arrays = 1
    if len(shape) > 1:
        if math.prod(shape[:-1]) > _FAST_JSON_MAX_ROWS and shape[-1] < _FAST_JSON_MIN_ROW:
            return None
        level = [value]
        for length in shape[1:]:  # every list above the numbers, checked
            below = []
            for array in level:
                for child in array:
                    if not isinstance(child, simdjson.Array) or len(child) != length:
                        return None
                    below.append(child)
            arrays += len(below)
            level = below
    try:
        values = np.frombuffer(value.as_buffer(of_type=of_type), dtype=_BUFFER_DTYPES[of_type])
    except (TypeError, ValueError):  # not all numbers, or not all of the type
        return None
    if values.size != math.prod(shape):
        return None
    if datatype == "FP32" and values.size and max(values.max(), -values.min()) >= _EXACT_DOUBLE_INTEGERS:
        return None
    return JsonNumbers(values, tuple(shape), arrays)
