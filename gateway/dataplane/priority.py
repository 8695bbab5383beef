"""A request's priority for an upstream's wait line (cluster/waiting.py):
Triton's ``priority`` request parameter, else the ``x-gateway-priority``
header, else its route's ``priority``. 1 is the highest; 0 means none
(Triton's default), so the next source decides, and at the end the lowest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.core.errors import invalid

PRIORITY_PARAMETER = "priority"
PRIORITY_HEADER = "x-gateway-priority"
# Longer header values are refused, not parsed: a level is a small number.
MAX_PRIORITY_DIGITS = 20


def parameter_priority(parameters: Mapping[str, Any]) -> int:
    """Triton's ``priority`` request parameter (0 when absent)."""
    value = parameters.get(PRIORITY_PARAMETER)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid(f"parameter '{PRIORITY_PARAMETER}' must be a non-negative integer (1 is the highest, "
                      "0 the default)")
    return value


def request_priority(headers: Mapping[str, str], route_default: int) -> int:
    """The priority of a request without its own parameter: its header's,
    else ``route_default``."""
    text = headers.get(PRIORITY_HEADER)
    if text is not None:
        text = text.strip()
        if not text.isdigit() or not text.isascii() or len(text) > MAX_PRIORITY_DIGITS:
            raise invalid(f"header {PRIORITY_HEADER} must be a non-negative integer (1 is the highest)")
        if int(text):
            return int(text)
    return route_default
