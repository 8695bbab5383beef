"""Reading JSON that orjson refuses only for its non-finite literals.

Triton writes ``NaN``, ``Infinity`` and ``-Infinity`` for non-finite
numbers and Python's json module writes them too; orjson refuses them, so
codecs read such text with Python's json. That parser also accepts what
orjson refuses for good reasons, and what no encoder in the gateway can
write back: lone surrogate escapes (``"\\ud800"`` is not Unicode text) and
integers beyond 64 bits. :func:`python_loads` reads those as orjson does:
surrogates are refused, integers beyond 64 bits become floats (refused
beyond a double's range), so what a codec reads is always something it can
write again.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

# Only text with an escape of a surrogate code point is checked for lone
# surrogates (by orjson's encoder, at C speed), and only text with a run of
# digits long enough for an integer beyond 64 bits has its integers checked.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONG_DIGITS = re.compile(r"[0-9]{19}")
_INT64_MIN, _UINT64_END = -(1 << 63), 1 << 64


class UnportableJson(ValueError):
    """JSON text Python's json reads, but that holds a value orjson (and
    every encoder after it) refuses."""


def python_loads(text: str) -> Any:
    """``text`` parsed by Python's json (non-finite literals read as floats).

    Raises ``json.JSONDecodeError`` for text that is not JSON,
    :class:`UnportableJson` for a lone surrogate or an integer beyond a
    double's range, RecursionError for nesting Python cannot follow.
    """
    value = json.loads(text, parse_int=_integer if _LONG_DIGITS.search(text) else None)
    if _SURROGATE_ESCAPE.search(text) is not None:
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError as exc:
            raise UnportableJson(_reason(str(exc))) from None
    return value


def _integer(text: str) -> int | float:
    """An integer as orjson reads it: a float beyond 64 bits."""
    value = int(text)
    if _INT64_MIN <= value < _UINT64_END:
        return value
    number = float(text)
    if math.isinf(number):
        raise UnportableJson("it holds an integer too large for a double")
    return number


def _reason(problem: str) -> str:
    if "surrogate" in problem:
        return "a string holds a lone surrogate escape (\\ud800 to \\udfff), which is not Unicode text"
    if "ecursion" in problem:
        return "the JSON nests too deeply to be written back"
    return problem[:200]
