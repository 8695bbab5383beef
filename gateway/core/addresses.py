"""Network addresses kept out of what clients see (docs/security.md:
addresses go to the log only): error messages are passed through
:func:`without_addresses` before they leave the gateway."""

from __future__ import annotations

import re

# What names a network address in a transport's words: URLs, IPv4 and
# bracketed IPv6 literals with their ports, grpc core's "ipv4:10.0.0.5:8001",
# Python's socket address tuples "('10.0.0.5', 8001)".
_ADDRESS = re.compile(
    r"\('[0-9a-f]*[.:][0-9a-f:.%]*',\s*\d+(?:,\s*\d+){0,2}\)"
    r"|\b[a-z][a-z0-9+.-]*://[^\s'\"]+"
    r"|(?:\b(?:ipv4|ipv6):)?(?:\[[0-9a-f.]*:[0-9a-f.]*:[0-9a-f:.]*(?:%[\w.-]+)?\]|%5B[0-9a-f:.%]+%5D"
    r"|\b\d{1,3}(?:\.\d{1,3}){3}\b)(?::\d+)?"
    r"|\bunix(?:-abstract)?:[^\s:,;]+", re.IGNORECASE)
ADDRESS_REDACTED = "<address>"


def without_addresses(text: str, endpoint: object = None) -> str:
    """``text`` with network addresses replaced, for errors clients see
    (docs/security.md: addresses go to the log only). ``endpoint`` (an
    Address, or its ``host:port`` text) is replaced also when it is a host
    name, and its host alone when that is qualified (has a dot)."""
    text = _ADDRESS.sub(ADDRESS_REDACTED, text)
    if endpoint is not None:
        where = str(endpoint)
        text = text.replace(where, ADDRESS_REDACTED)
        host = where.rpartition(":")[0].strip("[]")
        if "." in host:
            text = re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", ADDRESS_REDACTED, text)
    return text
