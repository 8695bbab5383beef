"""What the network upstream clients share: reading an upstream's reply
safely, and the bound on how much of it they accept."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gateway.confignode import Node
from gateway.errors import ErrorKind, GatewayError

# Replies may be larger than requests (an identity model echoes its input
# plus framing), so the default bound is a multiple of the request limit.
RESPONSE_LIMIT_FACTOR = 4


def parse_response_limit(node: Node) -> int | None:
    """The optional ``max_response_bytes`` key of an upstream."""
    return node.size("max_response_bytes", None)


def response_limit(configured: int | None, services: Any) -> int:
    if configured is not None:
        return configured
    return RESPONSE_LIMIT_FACTOR * services.config.limits.max_request_bytes


def too_large_reply(upstream: str, size: int, limit: int) -> GatewayError:
    return GatewayError(ErrorKind.UPSTREAM_BAD_RESPONSE,
                        f"upstream {upstream} sent a reply of {size} bytes, over max_response_bytes {limit}")


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
