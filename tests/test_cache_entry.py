"""The redis-backed response cache's entry format without sockets: every
datatype and parameter comes back as it went in, numeric tensors as
read-only views; its size is known before it is built; anything that is
not an entry written for the key asked (cut, longer, a byte changed, another
key's, foreign bytes) is refused as InvalidEntry, never another error; the
memory budget's refusal passes through."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gateway.core.errors import Saturated
from gateway.core.types import NUMPY_DTYPES, InferResponse, Tensor
from gateway.dataplane.filters.cache_entry import DATATYPES, InvalidEntry, entry_parts, entry_size, read_entry

KEY = bytes(range(16))


def _response() -> InferResponse:
    outputs = [Tensor.from_numpy(f"out-{name}", np.arange(6).reshape(2, 3).astype(NUMPY_DTYPES[name]), name)
               for name in DATATYPES if name != "BYTES"]
    outputs.append(Tensor.from_numpy("words", np.array([b"ab", b"", "\u00e9".encode()], dtype=object), "BYTES",
                                     {"note": "x", "n": 2, "ok": True, "f": 0.5}))
    outputs.append(Tensor.from_numpy("empty", np.zeros((0, 4), np.float32)))
    return InferResponse("m", "7", "id-1", outputs, {"sequence_end": False, "who": "\u00fc"})


def _entry(response: InferResponse) -> bytes:
    return b"".join(entry_parts(KEY, response))


def test_an_entry_reads_back_as_it_was_written() -> None:
    response = _response()
    value = _entry(response)
    assert entry_size(response) == len(value)
    charged: list[int] = []
    version, tensors, parameters = read_entry(value, KEY, charged.append)
    assert (version, dict(parameters)) == ("7", response.parameters)
    assert len(tensors) == len(response.outputs)
    for (name, datatype, shape, data, items), tensor in zip(tensors, response.outputs, strict=True):
        assert (name, datatype, shape, dict(items)) == (tensor.name, tensor.datatype, tensor.shape,
                                                        tensor.parameters)
        assert data.dtype == tensor.data.dtype
        np.testing.assert_array_equal(data, tensor.data)
        if datatype != "BYTES":
            assert not data.flags.writeable and data.ctypes.data % data.dtype.itemsize == 0  # aligned views
    assert charged == [3 * 64 + 3 * 4 + 4]  # the BYTES tensor's objects, before they were made


def _refused(value: Any) -> bool:
    try:
        read_entry(value, KEY, lambda size: None)
    except InvalidEntry:
        return True
    return False


def test_every_changed_byte_is_refused() -> None:
    value = _entry(_response())
    for index in range(len(value)):
        changed = bytearray(value)
        changed[index] ^= 0x21
        assert _refused(bytes(changed)), index


@pytest.mark.parametrize("how", ["cut", "longer", "empty", "another key", "pickle", "json", "head only"])
def test_what_is_no_entry_for_the_key_is_refused(how: str) -> None:
    value = _entry(_response())
    planted = {"cut": value[:-1], "longer": value + b"\0", "empty": b"", "pickle": b"\x80\x04\x95\x10",
               "json": b'{"outputs": []}', "head only": value[:38],
               "another key": b"".join(entry_parts(bytes(16), _response()))}[how]
    assert _refused(planted)


def test_the_budgets_refusal_is_no_invalid_entry() -> None:
    def full(size: int) -> None:
        raise Saturated("no room")

    with pytest.raises(Saturated):
        read_entry(_entry(_response()), KEY, full)


def test_what_json_cannot_carry_is_not_stored() -> None:
    response = InferResponse("m", "", "", [Tensor.from_numpy("x", np.zeros(2, np.int32))], {"big": 1 << 70})
    with pytest.raises(ValueError):
        entry_parts(KEY, response)
