"""Embedded demo models served in-process by the ``builtin`` upstream (a
backend only: no wire, so no error table)."""

from typing import Any

from gateway.protocols.registry import lazy_export

__all__ = ["BACKEND"]


def __getattr__(name: str) -> Any:
    return lazy_export(__name__, name, BACKEND="backend:BuiltinClient")
