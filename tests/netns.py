"""A private network namespace for tests that need a client address outside
127/8: the kernel's own namespaces (util-linux ``unshare``/``nsenter``,
iproute2 ``ip``), so the traffic never leaves this sandbox. Inside, loopback
is up and carries one more address, ``OTHER_ADDRESS``, from the benchmarking
range (RFC 2544), which no code treats as loopback."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from support import stop_process, wait_for

OTHER_ADDRESS = "198.18.0.1"


@contextmanager
def private_network() -> Iterator[list[str]]:
    """Yields the command prefix that runs a program inside the namespace
    (``nsenter --net=...``); the namespace lives as long as the context."""
    holder = subprocess.Popen(
        ["unshare", "--net", "--", "sh", "-c",
         f"ip link set lo up && ip addr add {OTHER_ADDRESS}/32 dev lo && exec sleep 600"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    prefix = ["nsenter", f"--net=/proc/{holder.pid}/ns/net", "--"]
    try:
        def configured() -> bool:
            if holder.poll() is not None:
                raise RuntimeError(f"no private network namespace: {holder.stderr.read().decode()}")  # type: ignore[union-attr]
            shown = subprocess.run([*prefix, "ip", "-4", "addr", "show", "dev", "lo"], capture_output=True, text=True,
                                   timeout=10)
            return f"inet {OTHER_ADDRESS}/32" in shown.stdout

        wait_for(configured, 10, "the private network namespace's addresses")
        yield prefix
    finally:
        stop_process(holder)
        holder.stderr.close()  # type: ignore[union-attr]
