"""A stable hash for routing decisions (sticky splits, consistent hashing,
a sequence's endpoint).

Python's ``hash()`` of a string changes per process; these decisions must
agree across restarts and across gateway replicas.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def stable_hash(text: str) -> int:
    """A 64-bit hash of ``text``, the same in every process."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def highest_random_weight(key: str, names: Sequence[str]) -> int:
    """The index of the name ``key`` goes to by rendezvous hashing: every
    name scores the hash of (name, key) and the highest wins (a tie, by the
    greater name). Any process holding the same names picks the same one,
    in whatever order it lists them; dropping a name moves only the keys it
    won (each to its second best), adding one takes about 1/N of the keys."""
    best, best_score = 0, -1
    for index, name in enumerate(names):
        score = stable_hash(f"{name}\x00{key}")
        if score > best_score or (score == best_score and name > names[best]):
            best, best_score = index, score
    return best
