"""A kept answer as bytes, for a cache shared through Redis: a compact
binary form of the answer's tensors (never pickle), read back strictly.

Layout (little-endian)::

    head    "GWRC" | crc32 u32 | version u8 | 0 u8 | tensors u16 | length u32
            | key digest (16) | model version length u16 | parameters length u32
            | model version (UTF-8) | parameters (JSON object, empty = none)
    tensor  name length u16 | datatype code u8 | dimensions u8 | parameters length u32
            | data length u64 | name (UTF-8) | dimensions (u64 each) | parameters (JSON)
            | zeros up to a multiple of 8 | data

Data is the tensor's raw little-endian bytes (BYTES: each element a u32
length and its bytes, Triton's binary layout), aligned so that numeric
tensors are read as numpy views over the value, no copy. The crc32 covers
everything after its own field; ``length`` is the whole entry's and the key
digest the key it was written under, so a value that is cut, changed or
stored under another key is refused, as is anything not written here.
:func:`read_entry` checks every length, datatype, shape and UTF-8 text
before it builds anything and raises :class:`InvalidEntry`, never another
error: a value in Redis is input like any other.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from gateway.core.errors import GatewayError
from gateway.core.limits import BYTES_ELEMENT_COST, BYTES_PREFIX
from gateway.core.tensors import array_to_raw, bytes_from_raw
from gateway.core.types import ELEMENT_SIZE, MAX_DIMS, NUMPY_DTYPES, InferResponse, element_count

MAGIC = b"GWRC"
VERSION = 1
# The datatypes by code (an entry stores the code): append only.
DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BF16", "BYTES")
_CODES = {name: code for code, name in enumerate(DATATYPES)}
_HEAD = struct.Struct("<4sIBBHI16sHI")
_TENSOR = struct.Struct("<HBBIQ")
_CRC_FROM = 8  # the crc32 covers the entry from the field after its own on
ALIGN = 8
MAX_TENSORS = 0xFFFF
MAX_ENTRY_BYTES = 0xFFFFFFFF


class InvalidEntry(Exception):
    """A value that is no entry of this format for this key."""


class _Refused(Exception):
    """``charge`` refused (the memory budget): its error, kept apart from the entry's own."""

    def __init__(self, error: GatewayError) -> None:
        super().__init__(str(error))
        self.error = error


def _charge(charge: Callable[[int], None], size: int) -> None:
    try:
        charge(size)
    except GatewayError as error:
        raise _Refused(error) from None


def _json(parameters: dict[str, Any]) -> bytes:
    return orjson.dumps(parameters) if parameters else b""


def _padding(offset: int) -> int:
    return -offset % ALIGN


def entry_parts(key: bytes, response: InferResponse) -> list[bytes | memoryview]:
    """``response``'s entry under ``key`` as parts to join (the data as the
    tensors hold it: a contiguous numeric array is not copied here).
    Raises ValueError when it cannot be one (parameters JSON cannot carry,
    more than MAX_TENSORS tensors, more than MAX_ENTRY_BYTES)."""
    outputs = response.outputs
    if len(outputs) > MAX_TENSORS:
        raise ValueError(f"{len(outputs)} tensors")
    try:
        version, parameters = response.model_version.encode(), _json(response.parameters)
        body: list[bytes | memoryview] = [version, parameters]
        offset = _HEAD.size + len(version) + len(parameters)
        for tensor in outputs:
            name, tensor_parameters = tensor.name.encode(), _json(tensor.parameters)
            data = array_to_raw(tensor)
            dims = struct.pack(f"<{len(tensor.shape)}Q", *tensor.shape)
            offset += _TENSOR.size + len(name) + len(dims) + len(tensor_parameters)
            pad = _padding(offset)
            body += (_TENSOR.pack(len(name), _CODES[tensor.datatype], len(tensor.shape), len(tensor_parameters),
                                  len(data)), name, dims, tensor_parameters, b"\0" * pad, data)
            offset += pad + len(data)
    except (orjson.JSONEncodeError, UnicodeEncodeError, struct.error, KeyError) as exc:
        raise ValueError(f"not storable: {exc}") from None
    if offset > MAX_ENTRY_BYTES:
        raise ValueError(f"{offset} bytes")
    fields = (VERSION, 0, len(outputs), offset, key, len(version), len(parameters))
    crc = zlib.crc32(_HEAD.pack(MAGIC, 0, *fields)[_CRC_FROM:])
    for part in body:
        crc = zlib.crc32(part, crc)
    return [_HEAD.pack(MAGIC, crc, *fields), *body]


def entry_size(response: InferResponse) -> int:
    """The bytes of ``response``'s entry (a pass over BYTES tensors)."""
    size = _HEAD.size + len(response.model_version.encode()) + len(_json(response.parameters))
    for tensor in response.outputs:
        size += _TENSOR.size + len(tensor.name.encode()) + 8 * len(tensor.shape) + len(_json(tensor.parameters))
        size += _padding(size)
        if tensor.datatype == "BYTES":
            size += sum(BYTES_PREFIX + len(item) for item in tensor.data.reshape(-1))
        else:
            size += tensor.data.size * ELEMENT_SIZE.get(tensor.datatype, 0)
    return size


def _parameters(value: bytes, start: int, length: int) -> tuple[tuple[str, Any], ...]:
    if not length:
        return ()
    parsed = orjson.loads(value[start:start + length])
    if not isinstance(parsed, dict):
        raise InvalidEntry("parameters are not a JSON object")
    return tuple(parsed.items())


def read_entry(value: bytes, key: bytes, charge: Callable[[int], None]) -> tuple[str, tuple[Any, ...],
                                                                                   tuple[tuple[str, Any], ...]]:
    """(model version, kept tensors, parameters) of the entry ``value``
    written under ``key``: numeric tensors are read-only views over
    ``value``; BYTES elements are made after ``charge`` took their cost.
    Raises InvalidEntry when ``value`` is anything else, and what
    ``charge`` raises."""
    try:
        return _read(value, key, charge)
    except InvalidEntry:
        raise
    except _Refused as refused:
        raise refused.error from None
    except (struct.error, ValueError, GatewayError, KeyError, IndexError) as exc:  # ValueError: UTF-8, JSON too
        raise InvalidEntry(str(exc)[:200]) from None


def _read(value: bytes, key: bytes, charge: Callable[[int], None]) -> tuple[str, tuple[Any, ...],
                                                                             tuple[tuple[str, Any], ...]]:
    end = len(value)
    if end < _HEAD.size:
        raise InvalidEntry(f"{end} bytes, shorter than the head")
    magic, crc, version, zero, count, length, written_for, version_length, parameters_length = \
        _HEAD.unpack_from(value)
    if (magic, version, zero) != (MAGIC, VERSION, 0):
        raise InvalidEntry("not an entry of this format")
    if length != end:
        raise InvalidEntry(f"says {length} bytes, holds {end}")
    if written_for != key:
        raise InvalidEntry("written under another key")
    if zlib.crc32(memoryview(value)[_CRC_FROM:]) != crc:
        raise InvalidEntry("crc32 mismatch")
    pos = _HEAD.size
    model_version = value[pos:pos + version_length].decode()
    pos += version_length
    parameters = _parameters(value, pos, parameters_length)
    pos += parameters_length
    tensors = []
    for _ in range(count):
        name_length, code, ndim, tensor_parameters_length, data_length = _TENSOR.unpack_from(value, pos)
        pos += _TENSOR.size
        if code >= len(DATATYPES) or ndim > MAX_DIMS:
            raise InvalidEntry(f"datatype code {code}, {ndim} dimensions")
        datatype = DATATYPES[code]
        name = value[pos:pos + name_length].decode()
        pos += name_length
        shape = struct.unpack_from(f"<{ndim}Q", value, pos)
        pos += 8 * ndim
        where = f"cached output {name!r}"
        elements = element_count(shape, where)
        tensor_parameters = _parameters(value, pos, tensor_parameters_length)
        pos += tensor_parameters_length
        pad = _padding(pos)
        if value[pos:pos + pad] != b"\0" * pad or pos + pad + data_length > end:
            raise InvalidEntry(f"{where}: its data overruns the entry")
        pos += pad
        data = memoryview(value)[pos:pos + data_length]
        if datatype == "BYTES":
            _charge(charge, elements * BYTES_ELEMENT_COST + data_length)
            array = bytes_from_raw(data, shape, elements, where)
        else:
            if data_length != elements * ELEMENT_SIZE[datatype]:
                raise InvalidEntry(f"{where}: {data_length} bytes for shape {list(shape)} of {datatype}")
            array = np.frombuffer(value, NUMPY_DTYPES[datatype], elements, pos).reshape(shape)
            if datatype == "BOOL" and elements and int(array.view(np.uint8).max()) > 1:
                raise InvalidEntry(f"{where}: BOOL bytes other than 0 and 1")
        pos += data_length
        tensors.append((name, datatype, shape, array, tensor_parameters))
    if pos != end:
        raise InvalidEntry(f"{end - pos} bytes after the last tensor")
    return model_version, tuple(tensors), parameters

