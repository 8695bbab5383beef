"""A real Redis server (Debian package ``redis-server``, installed by
scripts/ensure-redis.sh), run on 127.0.0.1 by the tests: no persistence,
its own free port, stopped by its process id."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

from support import free_port, stop_process, wait_for


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """``redis-server`` on 127.0.0.1; :meth:`stop` and :meth:`start` again
    keep its port (a Redis that went away and came back)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = directory / "redis.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed; `make test` installs it (scripts/ensure-redis.sh)")
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--dir", str(self.directory), "--daemonize", "no"],
            stdout=self._log, stderr=subprocess.STDOUT)

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited:\n{self.log_path.read_text(errors='replace')}")
            return _ping(self.port)

        wait_for(ready, 20, "redis-server to answer PING")
        return self

    def pause(self) -> None:
        """Stop the process without closing its sockets: a Redis that hangs."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)  # a paused server cannot handle its SIGTERM
            stop_process(self.proc)
            self.proc = None
            self._log.close()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
