"""Request bodies as both HTTP servers read them: gzip/deflate inflated
under the size limit, a chunk at a time; the coding an answer may take."""

from __future__ import annotations

import logging
import zlib

from gateway.core.errors import ErrorKind, GatewayError, too_large, unsupported

log = logging.getLogger(__name__)


_DECOMPRESS_CHUNK = 1 << 20


def request_coding(content_encoding: str) -> str:
    """A request's Content-Encoding, normalized ("identity" or "" for none,
    "gzip", "deflate"); UNSUPPORTED for any other, before its body is read."""
    encoding = content_encoding.strip().lower()
    if encoding not in ("identity", "", "gzip", "deflate"):
        raise unsupported(f"unsupported Content-Encoding '{encoding[:40]}'; use gzip or deflate")
    return encoding


def decompress(body: bytes | bytearray, encoding: str, limit: int) -> bytearray:
    """gzip/deflate body, refusing to inflate past ``limit`` bytes."""
    if encoding == "gzip":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        inflater = zlib.decompressobj()  # zlib-wrapped, as HTTP's "deflate" is
    else:
        raise unsupported(f"unsupported Content-Encoding '{encoding[:40]}'; use gzip or deflate")
    out = bytearray()
    data = body
    try:
        # Inflated a chunk at a time: each call releases the GIL while zlib
        # works, and the output never lands in one more whole-body copy.
        while data or not inflater.eof:
            chunk = inflater.decompress(data, min(_DECOMPRESS_CHUNK, limit + 1 - len(out)))
            out += chunk
            if len(out) > limit:
                raise too_large(f"request body inflates to more than the limit of {limit} bytes")
            data = inflater.unconsumed_tail
            if not chunk and not data:
                break
        out += inflater.flush()
    except zlib.error as exc:
        raise GatewayError(ErrorKind.MALFORMED_REQUEST, f"request body is not valid {encoding}: {exc}") from None
    if len(out) > limit:
        raise too_large(f"request body inflates to more than the limit of {limit} bytes")
    if not inflater.eof:
        raise GatewayError(ErrorKind.MALFORMED_REQUEST, f"request body is a truncated {encoding} stream")
    return out


def accepted_coding(accept_encoding: str, offered: tuple[str, ...] = ("gzip", "deflate")) -> str | None:
    """The content coding of ``offered`` the client prefers by its
    Accept-Encoding (RFC 9110 §12.5.3): q-values count, ``q=0`` refuses a
    coding, ``*`` stands for any coding not named; None for identity. Ties
    go to the earlier of ``offered``."""
    weights: dict[str, float] = {}
    for item in accept_encoding.lower().split(","):
        name, _, params = item.partition(";")
        name = name.strip()
        if not name:
            continue
        weight = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "q":
                try:
                    weight = min(max(float(value), 0.0), 1.0)
                except ValueError:
                    weight = 0.0  # a q-value that cannot be read accepts nothing
        weights[name] = weight
    best, best_weight = None, 0.0
    for coding in offered:
        weight = weights.get(coding, weights.get("*", 0.0))
        if weight > best_weight:
            best, best_weight = coding, weight
    return best
