"""Class labels for classification outputs: the `classification` section of
the configuration and the label files it names.

A label file is Triton's format: UTF-8 text, one label per line, the line
number (from 0) being the class index.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gateway.config.node import Node

log = logging.getLogger(__name__)
ALL_OUTPUTS = "*"  # a label file for every output of a model
MAX_LABEL_FILE_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class ClassificationConfig:
    # Model name as clients ask for it -> output name (ALL_OUTPUTS: every
    # output) -> absolute path of its label file.
    labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def label_file(self, model: str, output: str) -> str | None:
        per_output = self.labels.get(model)
        if per_output is None:
            return None
        return per_output.get(output) or per_output.get(ALL_OUTPUTS)


def read_labels(path: str) -> tuple[str, ...]:
    """The labels of a file; OSError or ValueError when it is unusable."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_LABEL_FILE_BYTES + 1)
    if len(data) > MAX_LABEL_FILE_BYTES:
        raise ValueError(f"is larger than {MAX_LABEL_FILE_BYTES >> 20} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text") from None
    return tuple(text.splitlines())


def _label_file(node: Node, base_dir: Path) -> str | None:
    if not isinstance(node.value, str) or not node.value:
        node.error("must be the path of a label file (one label per line)")
        return None
    path = (base_dir / node.value).resolve()
    try:
        read_labels(str(path))
    except OSError as exc:
        node.error(f"cannot read label file {path}: {exc.strerror or exc}")
        return None
    except ValueError as exc:
        node.error(f"label file {path} {exc}")
        return None
    return str(path)


def parse_classification(node: Node, base_dir: Path) -> ClassificationConfig:
    """``classification: {labels: {model: file | {output: file, ...}}}``;
    relative paths resolve against ``base_dir`` (the config file's folder)."""
    labels: dict[str, dict[str, str]] = {}
    for model, entry in node.child("labels", {}).entries():
        if isinstance(entry.value, dict):
            files = {output: _label_file(child, base_dir) for output, child in entry.entries()}
        else:
            files = {ALL_OUTPUTS: _label_file(entry, base_dir)}
        labels[model] = {output: path for output, path in files.items() if path is not None}
    node.check_no_unknown_keys()
    return ClassificationConfig(labels)


class LabelCache:
    """Label files read once and again only when they change on disk."""

    def __init__(self) -> None:
        self._files: dict[str, tuple[int, tuple[str, ...]]] = {}

    def get(self, path: str) -> tuple[str, ...]:
        """The file's labels; none if it has become unreadable since the
        configuration was loaded (classification then answers without)."""
        try:
            stamp = os.stat(path).st_mtime_ns
            cached = self._files.get(path)
            if cached is None or cached[0] != stamp:
                cached = self._files[path] = (stamp, read_labels(path))
            return cached[1]
        except (OSError, ValueError) as exc:
            log.warning("label file %s has become unusable (%s); classifying without labels", path, exc)
            return ()
