"""A stable hash for routing decisions (sticky splits, consistent hashing).

Python's ``hash()`` of a string changes per process; these decisions must
agree across restarts and across gateway replicas.
"""

from __future__ import annotations

import hashlib


def stable_hash(text: str) -> int:
    """A 64-bit hash of ``text``, the same in every process."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
