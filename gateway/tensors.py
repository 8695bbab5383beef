"""Tensor data in the forms every protocol shares, with no protocol's names.

JSON: a tensor's elements as a flat or nested (row-major) JSON list.
Binary: raw little-endian bytes, read as zero-copy numpy views; BYTES
elements each a uint32 little-endian length followed by the bytes (the
layout of Triton's binary extension and of KServe gRPC's raw contents).
BF16 travels as its 16-bit patterns in a uint16 array.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from gateway.errors import invalid, malformed, too_large
from gateway.limits import BYTES_PREFIX, TensorBudget
from gateway.types import ELEMENT_SIZE, NUMPY_DTYPES, Tensor, element_count

_INT_KINDS = "iu"


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
    if not isinstance(data, list):
        return 1
    if data and isinstance(data[0], list):
        return sum(_json_leaf_count(row) for row in data)
    return len(data)


def check_json_count(data: list[Any], shape: list[Any], where: str) -> None:
    """Raise the shape-versus-data error when ``data`` does not fill ``shape``."""
    needed = element_count(shape, where)
    held = _json_leaf_count(data)
    if held != needed:
        raise invalid(f"{where}: has {held} data elements but shape {list(shape)} needs {needed}")


def array_from_json(data: Any, datatype: str, shape: tuple[int, ...], count: int, where: str,
                    budget: TensorBudget | None = None) -> np.ndarray:
    """JSON ``data`` (flat or nested, row-major) as an array of ``shape``."""
    if not isinstance(data, list):
        raise malformed(f"{where}: 'data' must be a list")
    if datatype == "BYTES":
        items = _bytes_from_json(data, where)
        if len(items) != count:
            raise invalid(f"{where}: has {len(items)} data elements but shape {list(shape)} needs {count}")
        if budget is not None:
            budget.claim_bytes_items(items, where)
        array = np.empty(count, dtype=object)
        array[:] = items
        return array.reshape(shape)
    try:
        parsed = np.array(data)
    except (ValueError, OverflowError):
        raise invalid(f"{where}: 'data' is not a regular (non-ragged) list of numbers") from None
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
    else:
        if kind == "f" and datatype == "UINT64":
            # numpy infers float64 for ints above int64's range: redo exactly
            parsed = _uint64_from_json(data, shape, where)
            kind = parsed.dtype.kind
        if kind not in _INT_KINDS:
            raise invalid(f"{where}: {datatype} data must be integers")
        limits = np.iinfo(NUMPY_DTYPES[datatype])
        if parsed.min() < limits.min or parsed.max() > limits.max:
            raise invalid(f"{where}: a value is out of range for {datatype}")
    if datatype == "BF16":
        return float_to_bf16(parsed.astype(np.float64)).reshape(shape)
    return parsed.astype(NUMPY_DTYPES[datatype], copy=False).reshape(shape)


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
                   budget: TensorBudget | None = None) -> np.ndarray:
    """Raw little-endian bytes (zero-copy view) or length-prefixed BYTES."""
    if datatype == "BYTES":
        if budget is not None:  # the prefixes were claimed with the shape; now the payload
            budget.add_bytes(max(0, len(buffer) - BYTES_PREFIX * count), where)
        return bytes_from_raw(buffer, shape, count, where, budget.max_bytes_element if budget else None)
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
