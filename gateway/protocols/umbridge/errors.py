"""UM-Bridge's error table, both directions: the error type and HTTP
status the frontend answers for each kind, and what an upstream's
``(type, status)`` means (never passed through blindly)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gateway.core.errors import ErrorKind, ErrorTable

# ErrorKind -> (UM-Bridge error type, HTTP status). The first four types are
# the reference ones; the rest name conditions the reference never reports.
ERROR_TYPES: Mapping[ErrorKind, tuple[str, int]] = MappingProxyType({
    ErrorKind.MALFORMED_REQUEST: ("InvalidInput", 400),
    ErrorKind.INVALID_INPUT: ("InvalidInput", 400),
    ErrorKind.MODEL_NOT_FOUND: ("ModelNotFound", 400),
    ErrorKind.UNSUPPORTED: ("UnsupportedFeature", 400),
    ErrorKind.UNAUTHENTICATED: ("Unauthenticated", 401),
    ErrorKind.TOO_LARGE: ("InvalidInput", 413),
    ErrorKind.OVERLOADED: ("Overloaded", 429),
    ErrorKind.UPSTREAM_OVERLOADED: ("UpstreamOverloaded", 503),
    ErrorKind.NOT_READY: ("NotReady", 503),
    ErrorKind.UPSTREAM_UNAVAILABLE: ("UpstreamUnavailable", 503),
    ErrorKind.UPSTREAM_TIMEOUT: ("UpstreamTimeout", 504),
    ErrorKind.UPSTREAM_BAD_RESPONSE: ("InvalidOutput", 500),
    ErrorKind.INTERNAL: ("InternalError", 500),
})

# What the frontend's own answers stand for when no handler noted an error
# (metrics' outcome), and the kind of aiohttp's refusals: an unknown path or
# method is a feature the listener does not offer.
KIND_OF_HTTP_STATUS: Mapping[int, ErrorKind] = MappingProxyType({
    400: ErrorKind.MALFORMED_REQUEST, 401: ErrorKind.UNAUTHENTICATED, 404: ErrorKind.UNSUPPORTED,
    405: ErrorKind.UNSUPPORTED, 413: ErrorKind.TOO_LARGE, 429: ErrorKind.OVERLOADED, 500: ErrorKind.INTERNAL,
    503: ErrorKind.UPSTREAM_UNAVAILABLE, 504: ErrorKind.UPSTREAM_TIMEOUT,
})

# An upstream's error type as a kind, whatever its status (the reference
# client trusts the body): the reference types, and the gateway's own for a
# gateway upstream. Its overload and its bug are the upstream's, not this
# gateway's (never OVERLOADED or INTERNAL).
KIND_OF_UPSTREAM_TYPE: Mapping[str, ErrorKind] = MappingProxyType({
    "ModelNotFound": ErrorKind.MODEL_NOT_FOUND,
    "UnsupportedFeature": ErrorKind.UNSUPPORTED,
    "InvalidInput": ErrorKind.INVALID_INPUT,
    "InvalidOutput": ErrorKind.UPSTREAM_BAD_RESPONSE,
    "Unauthenticated": ErrorKind.UNAUTHENTICATED,
    "Overloaded": ErrorKind.UPSTREAM_OVERLOADED,
    "UpstreamOverloaded": ErrorKind.UPSTREAM_OVERLOADED,
    "NotReady": ErrorKind.NOT_READY,
    "UpstreamUnavailable": ErrorKind.UPSTREAM_UNAVAILABLE,
    "UpstreamTimeout": ErrorKind.UPSTREAM_TIMEOUT,
    "InternalError": ErrorKind.UPSTREAM_BAD_RESPONSE,
})
# An upstream's status as a kind when its type says nothing (none, or one
# of its own); other statuses: UPSTREAM_BAD_RESPONSE.
KIND_OF_UPSTREAM_STATUS: Mapping[int, ErrorKind] = MappingProxyType({
    404: ErrorKind.MODEL_NOT_FOUND, 413: ErrorKind.TOO_LARGE, 429: ErrorKind.UPSTREAM_OVERLOADED,
    501: ErrorKind.UNSUPPORTED, 502: ErrorKind.UPSTREAM_UNAVAILABLE, 503: ErrorKind.UPSTREAM_UNAVAILABLE,
    504: ErrorKind.UPSTREAM_TIMEOUT,
})


def kind_of_upstream_error(error_type: str, status: int) -> ErrorKind:
    if error_type == "InvalidInput" and status == 413:
        return ErrorKind.TOO_LARGE  # this table's own TOO_LARGE form
    kind = KIND_OF_UPSTREAM_TYPE.get(error_type)
    return kind if kind is not None else KIND_OF_UPSTREAM_STATUS.get(status, ErrorKind.UPSTREAM_BAD_RESPONSE)


def _kind_of_form(form: tuple[str, int]) -> ErrorKind:
    return kind_of_upstream_error(*form)


# Forms an upstream can answer: every type named above or none ("") or one
# of its own, with the statuses UM-Bridge servers use, 200 included (an
# `error` key in a 200 answer is an error too).
_STATUSES = (200, 400, 401, 404, 405, 413, 429, 500, 501, 502, 503, 504)
ERRORS = ErrorTable(ERROR_TYPES, _kind_of_form, frozenset(
    (error_type, status) for error_type in ("", "Unlisted", *KIND_OF_UPSTREAM_TYPE) for status in _STATUSES))
