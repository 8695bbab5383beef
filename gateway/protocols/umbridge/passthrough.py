"""UM-Bridge to UM-Bridge without re-encoding: a client's Evaluate goes to a
UM-Bridge upstream as the bytes it sent, and the upstream's answer comes
back as the bytes the upstream sent.

Both bodies are still read and checked (docs/umbridge.md, "Pass-through"):
the call's structure, model, feature and every input value before anything
goes upstream, and the answer's structure and every output value before
anything goes back. What is saved is writing both again as JSON, and for
big bodies most of the reading too: texts of 64 KiB and more are read by
the fast reader (gateway/core/tensors.py), vectors straight into float64 arrays
with no Python object per number; whatever it cannot vouch for is read by
the codec as before, with the codec's errors.

Bytes are handed on only when they mean exactly what the gateway checked:
strict JSON (no ``NaN``/``Infinity`` literals, no Python reprs, no integer
beyond 64 bits), no key given twice, every vector value a finite number.
Anything else is translated, as without the pass-through.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from gateway.core import tensors
from gateway.core.errors import GatewayError
from gateway.core.limits import count_bytes
from gateway.protocols.umbridge import codec

INPUT_KEY, OUTPUT_KEY = "input", "output"
_ESCAPED_COLONS = (b"\\u003a", b"\\u003A")
# The key "name" as written in a text without escapes (see renamed()).
_NAME_KEY = re.compile(rb'"name"[ \t\r\n]*:[ \t\r\n]*')


# --- reading --------------------------------------------------------------------


def _fast_object(root: Any, vectors_key: str) -> dict[str, Any]:
    """A parsed call or answer as Python values, the vectors of
    ``vectors_key`` as :class:`tensors.JsonNumbers` (NotFast otherwise: the
    codec reads the text and says what is wrong)."""
    obj = tensors.json_fields(root)
    for key, value in obj.items():
        if key != vectors_key:
            obj[key] = tensors.plain(value)
            continue
        if not tensors.is_json_array(value):
            raise tensors.NotFast
        numbers = [tensors.json_numbers(item, "FP64") for item in value]
        if not all(n is not None and len(n.shape) == 1 for n in numbers):
            raise tensors.NotFast
        obj[key] = numbers
    return obj


def _read(body: bytes | bytearray, vectors_key: str, load: Callable[[bytes | bytearray], dict[str, Any]],
          charge: Callable[[int], None] | None = None) -> tuple[dict[str, Any], bool]:
    """The parsed object (vectors as float64 arrays when the fast reader
    read them) and whether it was read as strict JSON."""
    if len(body) >= tensors.FAST_JSON_MIN_BYTES:
        fast = tensors.read_json_fast(body, lambda root: _fast_object(root, vectors_key), charge)
        if fast is not None:
            if vectors_key in fast:
                fast[vectors_key] = [numbers.values for numbers in fast[vectors_key]]
            return fast, True
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:  # non-finite literals, or not JSON: the codec reads it or says why
        return load(body), False
    if not isinstance(obj, dict):
        return load(body), False  # the codec's error
    return obj, True


def read_call(body: bytes | bytearray, charge: Callable[[int], None] | None = None) -> tuple[codec.Call, bool]:
    """:func:`codec.decode_call`, and whether the body is strict JSON
    without a repeated key (it may go upstream as it is once its values
    are checked). ``charge`` takes what the fast reader's parser needs
    (the memory budget)."""
    obj, strict = _read(body, INPUT_KEY, lambda text: codec.load_object(text, "the request body"), charge)
    call = codec.call_of(obj)
    return call, strict and single_keys(body, obj, INPUT_KEY)


def read_outputs(status: int, body: bytes | bytearray, upstream: str) -> tuple[list[np.ndarray], bool]:
    """The output vectors of an upstream's Evaluate answer (HTTP ``status``),
    and whether the client may have ``body`` as it is. Errors as the
    upstream client's other calls: a body that is no UM-Bridge answer is
    UPSTREAM_BAD_RESPONSE, an ``error`` (or a status other than 200) the
    upstream's error."""
    try:
        obj, strict = _read(body, OUTPUT_KEY, lambda text: codec.decode_answer(text, upstream))
    except GatewayError:
        if status != 200:  # e.g. the Python reference server's text 500 page
            raise codec.decode_error(status, None, upstream) from None
        raise
    if status != 200 or "error" in obj:  # the reference client trusts only the body
        raise codec.decode_error(status, obj, upstream)
    outputs = codec.decode_outputs(obj, upstream)
    return outputs, strict and finite(outputs) and single_keys(body, obj, OUTPUT_KEY)


# --- what may be handed on --------------------------------------------------------


def finite(vectors: list[np.ndarray]) -> bool:
    """No NaN or infinity (``null`` in strict JSON): how those are written
    is a policy of the side that writes them (``nonfinite``)."""
    return all(bool(np.isfinite(v).all()) for v in vectors)


def single_keys(text: bytes | bytearray, obj: dict[str, Any], vectors_key: str) -> bool:
    """Whether ``text`` (parsed as ``obj``, whose ``vectors_key`` holds only
    numbers) gives no key twice, so that a reader keeping the first of two
    keys reads what the gateway (the last one wins) checked.

    Counted at C speed instead of parsed again: every key is followed by
    one colon, and strings hold the same colons in the text (raw or
    escaped) as in ``obj`` written back; numbers hold none. A repeated key
    adds colons only to the text, so equal counts mean none (unequal counts
    from an escaped backslash before "u003a" only mean a translation)."""
    (in_text,) = count_bytes(text, b":")  # it picks bytes.count for small texts itself
    if text.find(b"\\") != -1:
        in_text += sum(text.count(escaped) for escaped in _ESCAPED_COLONS)
    skeleton = {**obj, vectors_key: None} if vectors_key in obj else obj
    try:
        return in_text == orjson.dumps(skeleton).count(b":")
    except orjson.JSONEncodeError:  # nested deeper than orjson writes
        return False


def renamed(body: bytes | bytearray, old: str, new: str) -> bytes | None:
    """``body`` (a strict call without repeated keys, for model ``old``)
    naming model ``new`` instead, or None when its ``name`` cannot be found
    for certain without parsing: a text with escapes, or with a ``name``
    key in ``config`` too.

    In a text without a backslash every quote opens or closes a string, so
    ``"name"`` followed by a colon is a key named name; when there is one,
    it is the call's own, and its value is the next string."""
    if body.find(b"\\") != -1:
        return None
    keys = list(_NAME_KEY.finditer(body))
    if len(keys) != 1:
        return None
    start = keys[0].end()
    end = body.find(b'"', start + 1)
    if body[start:start + 1] != b'"' or body[start + 1:end] != old.encode():
        return None
    return b"".join((body[:start], orjson.dumps(new), body[end + 1:]))
