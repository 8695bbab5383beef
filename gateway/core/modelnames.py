"""Which model names and versions a request may carry.

Checked where every frontend's request enters the data plane
(``DataPlane.resolve``), so REST paths, gRPC fields, UM-Bridge bodies and
GraphStorm's target-model header all get the same answer. Names only ever
select a route (upstream addresses come from the config alone); the check
keeps names that could be read as paths, or that would corrupt logs and
headers, from travelling further.
"""

from __future__ import annotations

import unicodedata

from gateway.core.errors import invalid, is_unicode

MAX_MODEL_NAME_CHARS = 256
# Path segments URL resolution removes (RFC 3986 §5.2.4): as a model name or
# version in an upstream's path they would name another resource.
DOT_SEGMENTS = frozenset({".", ".."})


def _shown(text: str) -> str:
    return repr(text[:64]) + ("..." if len(text) > 64 else "")


def check_name(text: str, what: str, *, required: bool) -> None:
    """Raise INVALID_INPUT for a name that is empty (when ``required``),
    too long, not Unicode text, holds control characters, ``/``, ``\\``
    or ``..``, or is ``.`` (a path segment upstream servers remove)."""
    if not text:
        if required:
            raise invalid(f"{what} is empty")
        return
    if len(text) > MAX_MODEL_NAME_CHARS:
        raise invalid(f"{what} is {len(text)} characters long, over the limit of {MAX_MODEL_NAME_CHARS}")
    if not text.isascii() and not is_unicode(text):
        raise invalid(f"{what} {_shown(text)} is not valid Unicode text (a lone surrogate or non-UTF-8 bytes)")
    if any(unicodedata.category(c) == "Cc" for c in text):
        raise invalid(f"{what} {_shown(text)} contains control characters")
    if "/" in text or "\\" in text:
        raise invalid(f"{what} {_shown(text)} contains a path separator")
    if ".." in text:
        raise invalid(f"{what} {_shown(text)} contains '..'")
    if text in DOT_SEGMENTS:
        raise invalid(f"{what} '.' is a relative path segment")


def check_model(model: str, version: str) -> None:
    check_name(model, "model name", required=True)
    check_name(version, "model version", required=False)
