"""What the network upstream clients share: reading an upstream's reply
safely, the bound on how much of it they accept, and why a connection
failed in words without the address (gateway/core/addresses.py keeps
addresses out of what clients see)."""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterator
from contextlib import contextmanager

from gateway.config.node import Node
from gateway.core.addresses import without_addresses
from gateway.core.errors import ErrorKind, GatewayError
from gateway.runtime.services import GatewayServices

# A connection attempt to an endpoint gives up after this long (s), whatever
# the request's deadline; once connected, only the deadline bounds a call.
CONNECT_TIMEOUT = 10.0

# Replies may be larger than requests (an identity model echoes its input
# plus framing), so the default bound is a multiple of the request limit.
RESPONSE_LIMIT_FACTOR = 4


def parse_response_limit(node: Node) -> int | None:
    """The optional ``max_response_bytes`` key of an upstream."""
    return node.size("max_response_bytes", None)


# How a streaming upstream without final flags (MLServer's ModelStreamInfer, SSE)
# has its responses relayed: each held until the next arrives, so the last is
# marked final (Triton's flags, one interval later), or each at once, none final
# (the stream's end is what a client that asked gets as the empty final response).
HOLD_LAST, IMMEDIATE = "hold_last", "immediate"


def parse_stream_relay(node: Node) -> str:
    """The optional ``stream_relay`` key of a streaming upstream."""
    return str(node.choice("stream_relay", (HOLD_LAST, IMMEDIATE), HOLD_LAST))


def response_limit(configured: int | None, services: GatewayServices) -> int:
    if configured is not None:
        return configured
    return RESPONSE_LIMIT_FACTOR * services.config.limits.max_request_bytes


def too_large_reply(upstream: str, size: int, limit: int, setting: str = "max_response_bytes") -> GatewayError:
    """A reply over the bound; ``setting`` names the key that sets it."""
    return GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                        f"upstream {upstream} sent a reply of {size} bytes, over {setting} {limit}")


@contextmanager
def reading_reply(upstream: str) -> Iterator[None]:
    """Decoding errors in an upstream's reply are the upstream's fault
    (UPSTREAM_BAD_RESPONSE, 502), not the client's (400, or 413 for a
    shape over a limit)."""
    try:
        yield
    except GatewayError as error:
        if error.kind not in (ErrorKind.MALFORMED_REQUEST, ErrorKind.INVALID_INPUT, ErrorKind.TOO_LARGE):
            raise
        raise GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                           f"upstream {upstream} sent an unreadable reply: {error.message}") from None


def connect_error_words(error: OSError, endpoint: object = None) -> str:
    """Why a connection could not be made, without the address: the TLS
    library's reason for a handshake failure, else the errno's words
    (asyncio's own text quotes the address)."""
    if isinstance(error, ssl.SSLError) or not error.errno:
        return without_addresses(str(error.strerror or error), endpoint)[:300]
    return os.strerror(error.errno)
