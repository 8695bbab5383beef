"""Per-request limits that codecs apply while decoding (no transport here).

:class:`TensorAllowance` bounds what one request's tensors may take in total,
checked from declared shapes before any tensor data is allocated.
:func:`check_json_depth` bounds JSON nesting before a body is parsed.
Listener-level limits (connections, concurrent requests, headers, read
timeouts) live with the servers: ``gateway/transport/http_server/`` and the gRPC
frontend. docs/security.md lists every limit and its default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gateway.core.errors import malformed, too_large
from gateway.core.types import ELEMENT_SIZE, element_count

# Width of a BYTES element's length prefix: its least wire size.
BYTES_PREFIX = 4
# A BYTES element decoded: a Python bytes object and its slot in the array
# (what the memory budget charges per element, beside the payload).
BYTES_ELEMENT_COST = 64


class TensorLimits(Protocol):
    """The limits a request's tensors are held to (the config's ``limits:``
    section, gateway.config.limits.Limits, has them)."""

    @property
    def max_tensor_elements(self) -> int: ...

    @property
    def max_request_elements(self) -> int: ...

    @property
    def max_request_tensor_bytes(self) -> int: ...

    @property
    def max_bytes_element(self) -> int: ...


class TensorAllowance:
    """What one request's tensors may take together.

    ``claim`` runs once per tensor when its datatype and shape are known and
    before its data is touched; it returns the element count and raises
    TOO_LARGE once the request's elements or bytes pass their limits. BYTES
    tensors claim their prefix size first and the rest once known.
    """

    __slots__ = ("bytes", "charge", "elements", "max_bytes_element", "max_request_elements",
                 "max_request_tensor_bytes", "max_tensor_elements")

    def __init__(self, max_tensor_elements: int, max_request_elements: int, max_request_tensor_bytes: int,
                 max_bytes_element: int, charge: Callable[[int], None] | None = None) -> None:
        self.max_tensor_elements = max_tensor_elements
        self.max_request_elements = max_request_elements
        self.max_request_tensor_bytes = max_request_tensor_bytes
        self.max_bytes_element = max_bytes_element
        self.elements = 0
        self.bytes = 0
        # The memory budget's reservation: BYTES elements become Python objects
        # (BYTES_ELEMENT_COST each), charged before they are made.
        self.charge = charge

    @classmethod
    def of(cls, limits: TensorLimits, charge: Callable[[int], None] | None = None) -> TensorAllowance:
        return cls(limits.max_tensor_elements, limits.max_request_elements, limits.max_request_tensor_bytes,
                   limits.max_bytes_element, charge)

    @classmethod
    def unlimited(cls, max_tensor_elements: int) -> TensorAllowance:
        """Only the per-tensor bound (for upstream replies, which
        ``max_response_bytes`` bounds as a whole)."""
        huge = 1 << 62
        return cls(max_tensor_elements, huge, huge, huge)

    def claim(self, datatype: str, shape: Any, where: str) -> int:
        count = element_count(shape, where, self.max_tensor_elements)
        self.elements += count
        if self.elements > self.max_request_elements:
            raise too_large(f"{where}: the request's tensors hold more than limits.max_request_elements "
                            f"({self.max_request_elements}) elements")
        self.add_bytes(count * ELEMENT_SIZE.get(datatype, BYTES_PREFIX), where)
        if datatype == "BYTES" and self.charge is not None:
            self.charge(count * BYTES_ELEMENT_COST)
        return count

    def add_bytes(self, size: int, where: str) -> None:
        self.bytes += size
        if self.bytes > self.max_request_tensor_bytes:
            raise too_large(f"{where}: the request's tensors take more than limits.max_request_tensor_bytes "
                            f"({self.max_request_tensor_bytes}) bytes")

    def check_bytes_element(self, length: int, where: str) -> None:
        if length > self.max_bytes_element:
            raise too_large(f"{where}: a BYTES element of {length} bytes is over limits.max_bytes_element "
                            f"({self.max_bytes_element})")

    def claim_bytes_items(self, items: list[bytes], where: str) -> None:
        """The payload of BYTES elements already claimed by ``claim``."""
        longest = max(map(len, items), default=0)
        self.check_bytes_element(longest, where)
        self.add_bytes(sum(map(len, items)), where)


# --- JSON nesting and size ---------------------------------------------------

_SCAN_CHUNK = 1 << 20
_BACKSLASH = 0x5C
_QUOTE, _OPEN_ARRAY, _OPEN_OBJECT, _CLOSE_ARRAY, _CLOSE_OBJECT, _COMMA = (ord(c) for c in '"[{]},')


@dataclass(frozen=True, slots=True)
class JsonShape:
    """What a JSON text will build when parsed, read without parsing it."""

    depth: int  # deepest nesting of arrays and objects
    values: int  # an upper bound on its values (commas outside strings, plus one)
    containers: int  # arrays and objects


def scan_json(body: bytes | bytearray | memoryview) -> JsonShape:
    """The nesting and size of a JSON text, in numpy, a chunk at a time.

    Memory stays a few times the chunk whatever the body holds, and each
    step is a numpy loop that releases the GIL, so it runs well in the
    offload pool. Escapes are removed first (``\\\\`` pairs, then ``\\"``),
    which leaves every remaining quote a string delimiter; brackets and
    commas between delimiters do not count. On text that is not JSON the
    result is only a bound, which is fine: such text is refused when parsed.
    """
    view = memoryview(body).cast("B")
    size = len(view)
    start = depth = deepest = quotes = values = containers = 0
    while start < size:
        end = min(start + _SCAN_CHUNK, size)
        while end < size and view[end - 1] == _BACKSLASH:  # a backslash run ends inside its chunk
            end += 1
        text = bytes(view[start:end])
        if b"\\" in text:
            text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
        count = text.count
        delimiters = count(b'"')
        if delimiters == 0 and quotes & 1:
            start = end  # all inside one string
            continue
        brackets = count(b"[") + count(b"{") + count(b"]") + count(b"}")
        if delimiters == 0 and brackets == 0:  # the bulk of a numeric array: counting is enough
            values += count(b",")
            start = end
            continue
        chars = np.frombuffer(text, dtype=np.uint8)
        outside = ((np.cumsum(chars == _QUOTE, dtype=np.int64) + quotes) & 1) == 0
        quotes += delimiters
        opens = ((chars == _OPEN_ARRAY) | (chars == _OPEN_OBJECT)) & outside
        closes = ((chars == _CLOSE_ARRAY) | (chars == _CLOSE_OBJECT)) & outside
        levels = np.cumsum(opens.view(np.int8) - closes.view(np.int8), dtype=np.int64)
        if levels.size:
            deepest = max(deepest, depth + int(levels.max()))
            depth += int(levels[-1])
        containers += int(np.count_nonzero(opens))
        values += int(np.count_nonzero((chars == _COMMA) & outside))
        start = end
    return JsonShape(deepest, values + 1, containers)


_SMALL_COUNT = 16 << 10


def count_bytes(text: bytes | bytearray | memoryview, chars: bytes) -> list[int]:
    """How often each byte of ``chars`` occurs in ``text``: numpy
    comparisons a chunk at a time (4-10 times faster than ``bytes.count``,
    and they release the GIL; memory stays a chunk). Small texts are
    counted by ``bytes.count``, cheaper than numpy's set-up."""
    if len(text) < _SMALL_COUNT and not isinstance(text, memoryview):
        return [text.count(char) for char in chars]
    view = np.frombuffer(text, dtype=np.uint8)
    counts = [0] * len(chars)
    for start in range(0, len(view), _SCAN_CHUNK):
        chunk = view[start:start + _SCAN_CHUNK]
        for index, char in enumerate(chars):
            counts[index] += int(np.count_nonzero(chunk == char))
    return counts


def whole_bytes(body: bytes | bytearray | memoryview) -> bytes | bytearray:
    """``body``'s bytes, uncopied when it views all of a bytes object."""
    if not isinstance(body, memoryview):
        return body
    if isinstance(body.obj, bytes | bytearray) and body.nbytes == len(body.obj):
        return body.obj
    return body.tobytes()


def check_json_depth(body: bytes | bytearray | memoryview, limit: int, what: str) -> None:
    """MALFORMED (the protocol's 400) when ``body`` nests deeper than ``limit``.

    A cheap count rules most bodies out before the scan: a text cannot nest
    deeper than it has opening brackets.
    """
    if sum(count_bytes(body, b"[{")) <= limit:
        return
    check_depth(scan_json(whole_bytes(body)).depth, limit, what)


def check_depth(depth: int, limit: int, what: str) -> None:
    if depth > limit:
        raise malformed(f"{what} nests JSON {depth} levels deep, over limits.max_json_depth ({limit})")
