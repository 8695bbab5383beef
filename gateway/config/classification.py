"""The ``classification:`` section of the config: the label files it names
per model and output, checked readable at load time. A label file is
Triton's format: UTF-8 text, one label per line, the line number (from 0)
being the class index. Served by the Triton classification extension
(gateway/protocols/triton/labels.py reads them again when they change)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gateway.config.node import Node

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
