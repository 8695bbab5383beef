"""Outlier ejection's arithmetic (pure): how long an endpoint stays ejected,
and how its ejection count decays while it stays healthy. The cluster
(gateway/dataplane/cluster/cluster.py) ejects and readmits."""

from __future__ import annotations


def ejection_time(base: float, maximum: float, ejections: int) -> float:
    """How long the ``ejections``-th ejection (1, 2, ...) lasts: growing linearly."""
    return min(maximum, base * ejections)


def decayed_ejections(ejections: int, healthy_for: float, base: float) -> int:
    """The ejection multiplier forgets one ejection per ``base`` seconds healthy."""
    return max(0, ejections - int(healthy_for // base))
