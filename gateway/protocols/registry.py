"""Which protocol names the config accepts, and where their code lives.

One line per protocol: its name and its package. A package exports what it
offers as ``FRONTEND`` (a Frontend class), ``BACKEND`` (an UpstreamClient
class) and ``ERRORS`` (its gateway.core.errors.ErrorTable), listed in its
``__all__`` and imported on first use (:func:`lazy_export`), so a gateway
that never configures gRPC never imports grpcio and ``gateway check`` stays
fast.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from gateway.protocols.base import UpstreamClient

PROTOCOLS: dict[str, str] = {
    "builtin": "gateway.protocols.builtin",
    "graphstorm": "gateway.protocols.graphstorm",
    "openai": "gateway.protocols.openai",
    "umbridge": "gateway.protocols.umbridge",
    "v1-rest": "gateway.protocols.v1_rest",
    "v2-grpc": "gateway.protocols.v2_grpc",
    "v2-rest": "gateway.protocols.v2_rest",
}

# side -> the name a package exports it under
EXPORTS = {"frontend": "FRONTEND", "backend": "BACKEND", "errors": "ERRORS"}


def _package(protocol: str) -> ModuleType:
    return importlib.import_module(PROTOCOLS[protocol])


def offers(protocol: str, side: str) -> bool:
    """Whether ``protocol`` has that side (its package's ``__all__`` says,
    without importing the side)."""
    return EXPORTS[side] in getattr(_package(protocol), "__all__", ())


def names(side: str) -> list[str]:
    return sorted(protocol for protocol in PROTOCOLS if offers(protocol, side))


def load(protocol: str, side: str) -> Any:
    """The frontend or backend class (or the error table) of a protocol;
    KeyError if the protocol is unknown or lacks that side."""
    if not offers(protocol, side):
        raise KeyError(protocol)
    return getattr(_package(protocol), EXPORTS[side])


def backend(protocol: str) -> type[UpstreamClient]:
    """A protocol's backend class (what the app hands the data plane's
    clusters); KeyError if it has none."""
    return load(protocol, "backend")


def framing_headers() -> tuple[frozenset[str], tuple[str, ...]]:
    """Every protocol's framing headers (its package's ``FRAMING_HEADERS``:
    lower-case names, or prefixes ending in ``*``): the exact names and the
    prefixes. They describe one message's encoding, so no route forwards
    them (gateway/dataplane/routing.py)."""
    declared = [name for protocol in PROTOCOLS for name in getattr(_package(protocol), "FRAMING_HEADERS", ())]
    return (frozenset(name for name in declared if not name.endswith("*")),
            tuple(name[:-1] for name in declared if name.endswith("*")))


def lazy_export(package: str, name: str, **where: str) -> Any:
    """For a protocol package's module ``__getattr__``: ``name``'s value from
    ``where[name]`` ("module:attribute", the module relative to the package),
    imported now and kept on the package so later lookups are plain."""
    if name not in where:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module, _, attribute = where[name].partition(":")
    value = getattr(importlib.import_module(f"{package}.{module}"), attribute)
    setattr(sys.modules[package], name, value)
    return value
