"""Reading the configuration's YAML, strict about duplicate keys and bounded.

PyYAML keeps the last of two equal keys in a mapping without a word, so a
key written twice (often a merge mistake) silently drops the first value.
The loader here reports every duplicate with both line numbers instead.

Anchors and aliases (``&defaults`` / ``<<: *defaults``) stay allowed, but
a document is refused while it is composed, before anything is built from
it, once it would expand to more than :data:`MAX_NODES` nodes (aliases
counted as the copies they become: a few hundred bytes of nested aliases
can stand for billions of nodes), nest deeper than :data:`MAX_DEPTH`, or
hold more than :data:`MAX_BYTES` of text. An alias to a node that contains
it is refused too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gateway.config.node import ConfigError

_MERGE_TAG = "tag:yaml.org,2002:merge"
# Shipped configs have a few hundred nodes, 8 levels and 2 KB; a thousand
# routes are ~10k nodes and ~100 KB. These bound the time (pure-Python
# parsing, ~150 KB/s) and memory one load can take, on reload too.
MAX_BYTES = 1 << 20
MAX_NODES = 100_000
MAX_DEPTH = 64


class _StrictLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[str] = []
        self._nodes = 0  # nodes of the document so far, each alias as the copy it becomes
        self._depth = 0
        self._sizes: dict[yaml.Node, int] = {}  # anchored node -> its size, once composed

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        at: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)
            size = self._sizes.get(node) if node is not None else None
            if size is None:  # still being composed: the alias is inside its own anchor
                raise _refused(at, f"alias *{event.anchor} refers to a node that contains it")
            self._count(size, at)
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _refused(at, f"nested deeper than {MAX_DEPTH} levels")
        before = self._nodes
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._count(1, at)
        if node is not None and event.anchor is not None:
            self._sizes[node] = self._nodes - before
        return node

    def _count(self, nodes: int, at: Any) -> None:
        self._nodes += nodes
        if self._nodes > MAX_NODES:
            raise _refused(at, f"the document expands to more than {MAX_NODES} nodes "
                               "(aliases count as the copies they stand for)")

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
        # Before merge keys (``<<``) are flattened: a key written here may
        # override a merged one, which is what merging is for.
        first: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = first.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the constructor reports it
                continue
            if seen is not key_node.start_mark:
                self.duplicates.append(_duplicate(str(key), key_node.start_mark, seen))
        return super().construct_mapping(node, deep)


_TOO_LARGE = f"<file>: refused: larger than {MAX_BYTES >> 20} MiB"


def read_config_text(path: str | Path) -> str:
    """A config file's text; more than MAX_BYTES is refused before it is read."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError([f"<file>: cannot read {path}: {exc.strerror}"]) from None
    if len(data) > MAX_BYTES:
        raise ConfigError([_TOO_LARGE])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"<file>: not UTF-8 text (byte {exc.start})"]) from None


def _refused(at: Any, reason: str) -> ConfigError:
    return ConfigError([f"line {at.line + 1}, column {at.column + 1}: refused: {reason}"])


def _duplicate(key: str, at: yaml.Mark, first: yaml.Mark) -> str:
    if at.line != first.line:
        return f"line {at.line + 1}: duplicate key {key!r} (first at line {first.line + 1})"
    return (f"line {at.line + 1}, column {at.column + 1}: duplicate key {key!r} "
            f"(first at line {first.line + 1}, column {first.column + 1})")


def load_yaml(text: str) -> Any:
    """Parse one YAML document; ConfigError with line numbers for a syntax
    error, for any mapping (block, flow, nested) that repeats a key, or for
    a document beyond the bounds above."""
    if len(text) > MAX_BYTES:
        raise ConfigError([_TOO_LARGE])
    loader = _StrictLoader(text)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<file>"
        raise ConfigError([f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}"]) from None
    finally:
        loader.dispose()
    if loader.duplicates:
        raise ConfigError(loader.duplicates)
    return data


def compose_yaml(text: str) -> yaml.Node | None:
    """The node tree of one document within the same bounds (for telling
    lines of YAML paths); None when the text does not load."""
    if len(text) > MAX_BYTES:
        return None
    loader = _StrictLoader(text)
    try:
        return loader.get_single_node()
    except (yaml.YAMLError, ConfigError):
        return None
    finally:
        loader.dispose()
