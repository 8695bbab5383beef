"""Reading the configuration's YAML, strict about duplicate keys.

PyYAML keeps the last of two equal keys in a mapping without a word, so a
key written twice (often a merge mistake) silently drops the first value.
The loader here reports every duplicate with both line numbers instead.
"""

from __future__ import annotations

from typing import Any

import yaml

from gateway.confignode import ConfigError

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[str] = []

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


def _duplicate(key: str, at: yaml.Mark, first: yaml.Mark) -> str:
    if at.line != first.line:
        return f"line {at.line + 1}: duplicate key {key!r} (first at line {first.line + 1})"
    return (f"line {at.line + 1}, column {at.column + 1}: duplicate key {key!r} "
            f"(first at line {first.line + 1}, column {first.column + 1})")


def load_yaml(text: str) -> Any:
    """Parse one YAML document; ConfigError with line numbers for a syntax
    error or for any mapping (block, flow, nested) that repeats a key."""
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
