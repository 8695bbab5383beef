"""Class labels for classification outputs: the label files the
configuration's `classification` section names (gateway/config/classification.py),
read once and again when they change on disk.
"""

from __future__ import annotations

import logging
import os

from gateway.config.classification import read_labels

log = logging.getLogger(__name__)


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
