"""Request ids the gateway makes: 32 lower-case hex digits, unique, also
across worker processes forked from one parent."""

from __future__ import annotations

import os
import re

from gateway.core.record import new_request_id

_ID = re.compile(r"[0-9a-f]{32}")


def test_ids_are_32_lower_case_hex_digits_and_distinct() -> None:
    ids = [new_request_id() for _ in range(20000)]
    assert all(_ID.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_worker_makes_other_ids_than_its_parent() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, then out without running pytest's teardown
        os.write(write, "".join(new_request_id() for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    try:
        child = os.read(read, 4 * 32 + 1).decode()
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    parent = "".join(new_request_id() for _ in range(4))
    assert len(child) == 4 * 32 and child != parent
