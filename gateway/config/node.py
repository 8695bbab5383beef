"""Typed, path-aware access to a parsed YAML tree.

Every accessor records a problem as ``"<yaml path>: <message>"`` and returns
a fallback, so one `gateway check` run reports every error in a file rather
than the first one. Protocol modules use the same class to read their own
listener/upstream options. The helpers at the end are shared by the section
parsers (upstreams.py, routes.py, server.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import yaml

T = TypeVar("T")
_MISSING: Any = object()
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class ConfigError(Exception):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class EnvText(str):
    """What a scalar that was exactly one ``${VAR}`` became. A string field
    takes it as it is; a number or boolean field types it as YAML types a
    plain scalar (``port: ${PORT}`` is an int). Only lives in the tree
    handed to Node, which unwraps it."""

    __slots__ = ()


_TYPED_TAGS = frozenset({"tag:yaml.org,2002:null", "tag:yaml.org,2002:bool",
                         "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"})


def type_scalar(text: str) -> Any:
    """``text`` typed as YAML types a plain scalar, limited to null, bool,
    int and float (never a timestamp); the empty string stays a string."""
    if not text:
        return text
    loader = yaml.SafeLoader("")
    tag = loader.resolve(yaml.ScalarNode, text, (True, False))
    return loader.construct_object(yaml.ScalarNode(tag, text)) if tag in _TYPED_TAGS else text


def _takes_text(kind: type | tuple[type, ...]) -> bool:
    return kind is str or (isinstance(kind, tuple) and str in kind)


class Node:
    """One position in the YAML tree, with its path for error messages."""

    def __init__(self, value: Any, path: str, problems: list[str]) -> None:
        self.from_env = type(value) is EnvText
        self.value: Any = str(value) if self.from_env else value
        self.path = path
        self.problems = problems
        self._used: set[str] = set()

    def error(self, message: str, key: str | int | None = None) -> None:
        where = self._join(key) if key is not None else (self.path or "<root>")
        self.problems.append(f"{where}: {message}")

    def _join(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    @property
    def is_mapping(self) -> bool:
        return isinstance(self.value, dict)

    def has(self, key: str) -> bool:
        return isinstance(self.value, dict) and key in self.value

    def child(self, key: str, default: Any = _MISSING) -> Node:
        self._used.add(key)
        if not isinstance(self.value, dict):
            return Node(default if default is not _MISSING else None, self._join(key), self.problems)
        if key not in self.value:
            if default is _MISSING:
                self.error("is required", key)
                return Node(None, self._join(key), self.problems)
            return Node(default, self._join(key), self.problems)
        return Node(self.value[key], self._join(key), self.problems)

    def items(self) -> Iterator[Node]:
        if self.value is None:
            return iter(())
        if not isinstance(self.value, list):
            self.error("must be a list")
            return iter(())
        return (Node(v, self._join(i), self.problems) for i, v in enumerate(self.value))

    def entries(self) -> Iterator[tuple[str, Node]]:
        if self.value is None:
            return iter(())
        if not isinstance(self.value, dict):
            self.error("must be a mapping")
            return iter(())
        return ((str(k), Node(v, self._join(str(k)), self.problems)) for k, v in self.value.items())

    # Typed getters: each reads one key of this mapping.

    def get(self, key: str, kind: type[T] | tuple[type, ...], default: Any = _MISSING) -> Any:
        node = self.child(key, default)
        value = node.value
        if node.from_env and not _takes_text(kind):
            value = type_scalar(value)
        elif isinstance(value, EnvText):
            value = str(value)  # the marker stays in the tree: fields get plain text
        if value is None and default is not _MISSING:
            return default
        if isinstance(value, bool) and kind in (int, float):
            node.error(f"must be a {kind.__name__}, got a boolean")  # type: ignore[union-attr]
            return default if default is not _MISSING else None
        if kind is float and isinstance(value, int):
            return float(value)
        if not isinstance(value, kind):
            wanted = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            if value is not None or default is _MISSING:
                node.error(f"must be a {wanted}, got {type(value).__name__}")
            return default if default is not _MISSING else None
        return value

    def string(self, key: str, default: Any = _MISSING) -> Any:
        return self.get(key, str, default)

    def flag(self, key: str, default: Any = _MISSING) -> Any:
        return self.get(key, bool, default)

    def integer(self, key: str, default: Any = _MISSING, minimum: int | None = None) -> Any:
        value = self.get(key, int, default)
        if isinstance(value, int) and minimum is not None and value < minimum:
            self.error(f"must be at least {minimum}, got {value}", key)
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = _MISSING) -> Any:
        value = self.string(key, default)
        if value is not None and value not in choices:
            self.error(f"must be one of {', '.join(choices)}; got {value!r}", key)
            return default if default is not _MISSING else choices[0]
        return value

    def duration(self, key: str, default: Any = _MISSING) -> Any:
        """Seconds, from a number or a string like '250ms', '30s', '2m'."""
        node = self.child(key, default)
        value = node.value
        if value is None or isinstance(value, bool):
            if value is not None:
                node.error("must be a duration like 250ms, 30s or 2m")
            return default if default is not _MISSING else None
        if isinstance(value, (int, float)):
            seconds = float(value)
        else:
            match = _DURATION.match(str(value))
            if not match:
                node.error(f"must be a duration like 250ms, 30s or 2m; got {value!r}")
                return default if default is not _MISSING else None
            seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        if seconds < 0:
            node.error("must not be negative")
        return seconds

    def size(self, key: str, default: Any = _MISSING) -> Any:
        """Bytes, from an int or a string like '64MiB', '512KiB', '1GiB'."""
        node = self.child(key, default)
        value = node.value
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                node.error("must not be negative")
            return value
        match = re.match(r"^\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*$", str(value)) if isinstance(value, str) else None
        if not match:
            if value is not None or default is _MISSING:
                node.error(f"must be a size like 65536, 512KiB or 64MiB; got {value!r}")
            return default if default is not _MISSING else None
        scale = {"B": 1, None: 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[match.group(2)]
        return int(match.group(1)) * scale

    def parsed(self, key: str, parse: Callable[[Node], T], default: Any = _MISSING) -> T:
        return parse(self.child(key, default))

    def check_no_unknown_keys(self) -> None:
        if isinstance(self.value, dict):
            for key in self.value:
                if key not in self._used:
                    self.error("unknown key", str(key))


# --- helpers of the section parsers ------------------------------------------


def positive_duration(node: Node, key: str, default: Any) -> Any:
    value = node.duration(key, default)
    if value is not None and value <= 0:
        node.error("must be more than 0", key)
    return value


def percent(node: Node, key: str, default: float) -> float:
    value = node.get(key, float, default)
    if not 0 <= value <= 100:
        node.error(f"must be a percentage from 0 to 100, got {value:g}", key)
    return float(value)


def section(node: Node) -> bool:
    """True when ``node`` holds a mapping to read; null means defaults."""
    if node.value is None:
        return False
    if not node.is_mapping:
        node.error("must be a mapping")
        return False
    return True
