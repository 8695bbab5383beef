"""Per-request limits that codecs apply while decoding (no transport here).

:class:`TensorBudget` bounds what one request's tensors may take in total,
checked from declared shapes before any tensor data is allocated.
:func:`check_json_depth` bounds JSON nesting before a body is parsed.
Listener-level limits (connections, concurrent requests, headers, read
timeouts) live with the servers: ``gateway/httpserver.py`` and the gRPC
frontend. docs/security.md lists every limit and its default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gateway.errors import malformed, too_large
from gateway.types import ELEMENT_SIZE, element_count

if TYPE_CHECKING:
    from gateway.config import Limits

# Width of a BYTES element's length prefix: its least wire size.
BYTES_PREFIX = 4


class TensorBudget:
    """What one request's tensors may take together.

    ``claim`` runs once per tensor when its datatype and shape are known and
    before its data is touched; it returns the element count and raises
    TOO_LARGE once the request's elements or bytes pass their limits. BYTES
    tensors claim their prefix size first and the rest once known.
    """

    __slots__ = ("bytes", "elements", "max_bytes_element", "max_request_elements",
                 "max_request_tensor_bytes", "max_tensor_elements")

    def __init__(self, max_tensor_elements: int, max_request_elements: int, max_request_tensor_bytes: int,
                 max_bytes_element: int) -> None:
        self.max_tensor_elements = max_tensor_elements
        self.max_request_elements = max_request_elements
        self.max_request_tensor_bytes = max_request_tensor_bytes
        self.max_bytes_element = max_bytes_element
        self.elements = 0
        self.bytes = 0

    @classmethod
    def of(cls, limits: Limits) -> TensorBudget:
        return cls(limits.max_tensor_elements, limits.max_request_elements, limits.max_request_tensor_bytes,
                   limits.max_bytes_element)

    @classmethod
    def unlimited(cls, max_tensor_elements: int) -> TensorBudget:
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


# --- JSON nesting -------------------------------------------------------------

# Byte -> 1 for the characters that matter to nesting: brackets, quotes, backslashes.
_STRUCTURAL = np.zeros(256, dtype=np.bool_)
_STRUCTURAL[list(b'[]{}"\\')] = True
_STRUCTURAL.flags.writeable = False  # a constant table
_OPEN = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSE = np.frombuffer(b"]}", dtype=np.uint8)
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


def json_depth(body: bytes | bytearray | memoryview) -> int:
    """The deepest nesting of arrays and objects in a JSON text.

    Runs in numpy over the structural characters only, so it costs a few
    passes over the bytes whatever the nesting. Brackets inside strings do
    not count; a quote counts as a delimiter unless an odd run of
    backslashes precedes it. On text that is not JSON the result is only a
    bound, which is fine: such text is refused when parsed.
    """
    data = np.frombuffer(body, dtype=np.uint8)
    if data.size == 0:
        return 0
    positions = np.flatnonzero(_STRUCTURAL[data])
    chars = data[positions]
    # For each structural char: is the one before it a backslash right next to it?
    # Runs of backslashes are consecutive entries; their length decides escaping.
    count = chars.size
    is_backslash = chars == _BACKSLASH
    after_backslash = np.zeros(count, dtype=np.bool_)  # right after a backslash, no gap
    after_backslash[1:] = is_backslash[:-1] & (np.diff(positions) == 1)
    run_before = np.zeros(count, dtype=np.int64)  # backslashes right before each entry
    if after_backslash.any():
        # Backslash runs are consecutive entries; number each entry within its run.
        continues = is_backslash & after_backslash
        starts = np.flatnonzero(~continues)
        run_length = np.arange(count) - starts[np.cumsum(~continues) - 1] + 1
        run_before[1:] = np.where(after_backslash[1:], run_length[:-1], 0)
    delimiter = (chars == _QUOTE) & (run_before % 2 == 0)
    inside = (np.cumsum(delimiter) - delimiter) % 2 == 1  # within a string (delimiters themselves: no)
    step = np.isin(chars, _OPEN).astype(np.int64) - np.isin(chars, _CLOSE)
    step[inside] = 0
    return int(np.cumsum(step).max(initial=0))


def check_json_depth(body: bytes | bytearray | memoryview, limit: int, what: str) -> None:
    """MALFORMED (the protocol's 400) when ``body`` nests deeper than ``limit``.

    A cheap count rules most bodies out before the scan: a text cannot nest
    deeper than it has opening brackets.
    """
    raw = bytes(body) if isinstance(body, memoryview) else body
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return
    depth = json_depth(raw)
    if depth > limit:
        raise malformed(f"{what} nests JSON {depth} levels deep, over limits.max_json_depth ({limit})")
