"""Raw tensor bytes on the protobuf wire without protobuf copying them.

``raw_input_contents`` / ``raw_output_contents`` hold whole tensors. Going
through protobuf objects costs two or three copies of each (into the
message, into the serialized string, out of the parsed message). A message
on the wire is a sequence of fields, and concatenating serialized fields is
the same as setting them, so:

- :func:`serialize` writes the small "head" message with protobuf and
  appends each raw entry as a field of its own: one copy, into the result;
- :func:`split` walks the top-level fields of received bytes, hands the head
  fields to protobuf and returns the raw entries as zero-copy memoryviews;
- :func:`string_field` writes one string field, which appended to a
  serialized message replaces that field's value (see passthrough).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.core.errors import malformed

_LENGTH_DELIMITED = 2


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def string_field(field_number: int, value: str) -> bytes:
    """One serialized string field. Appended to a message it overrides an
    earlier value of a singular field: parsers keep the last one."""
    encoded = value.encode()
    return _varint(field_number << 3 | _LENGTH_DELIMITED) + _varint(len(encoded)) + encoded


def message_field(field_number: int, parts: Sequence[bytes]) -> bytes:
    """One serialized message field whose value is ``parts`` joined (one copy)."""
    size = sum(len(part) for part in parts)
    return b"".join((_varint(field_number << 3 | _LENGTH_DELIMITED), _varint(size), *parts))


def serialize(head: Any, field_number: int, chunks: Sequence[Any]) -> bytes:
    """``head`` serialized, followed by ``chunks`` as entries of the repeated
    bytes field ``field_number`` (which ``head`` must leave empty)."""
    tag = _varint(field_number << 3 | _LENGTH_DELIMITED)
    parts: list[Any] = [head.SerializeToString()]
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        parts += (tag + _varint(view.nbytes), view)
    return b"".join(parts)


def _read_varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    end = len(data)
    while True:
        if at >= end or shift > 63:
            raise malformed("the message is truncated or has a malformed varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def split(data: bytes | memoryview, field_number: int) -> tuple[bytes, list[memoryview]]:
    """(the message without field ``field_number``, that field's entries as
    views into ``data``). Malformed framing is a MALFORMED_REQUEST."""
    view = memoryview(data).cast("B")
    head = bytearray()
    raw: list[memoryview] = []
    at, end = 0, len(view)
    while at < end:
        start = at
        key, at = _read_varint(view, at)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, at = _read_varint(view, at)
        elif wire_type == 1:
            at += 8
        elif wire_type == 5:
            at += 4
        elif wire_type == _LENGTH_DELIMITED:
            length, at = _read_varint(view, at)
            if number == field_number and at + length <= end:
                raw.append(view[at:at + length])
                at += length
                continue
            at += length
        else:
            raise malformed(f"the message has an unsupported wire type {wire_type}")
        if at > end:
            raise malformed("the message is truncated")
        head += view[start:at]
    return bytes(head), raw
