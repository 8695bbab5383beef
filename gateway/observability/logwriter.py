"""Lines written to a file descriptor by one thread, never by the caller.

A blocking ``write(2)`` on the event loop stops every listener while the sink
is stuck (a pipe nobody reads, a frozen disk). :class:`LineWriter` takes
lines into a bounded queue and returns at once; its thread writes them. When
the queue is full the new line is dropped and counted, so a stuck sink costs
log lines, never serving. The access log and the stderr log handler of
``gateway serve`` both write through one.

Every ``write(2)`` carries whole lines only and at most ``PIPE_BUF`` bytes
(one line longer than that goes alone), so several processes sharing a pipe
never interleave inside a line.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import select
import threading
import time
from collections.abc import Callable

# Line breaks for readers that split on Unicode's (str.splitlines), but for
# \n and \r (a traceback's lines): written as escapes in the stderr log.
_LINE_BREAKS = re.compile("[\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
# A line's queue cost beyond its bytes (the bytes object and the deque slot),
# so many short lines cannot hold much more memory than the byte bound says.
LINE_OVERHEAD = 64
# Wait this long for a non-blocking descriptor to take bytes, then look again
# whether the writer was abandoned.
WRITABLE_POLL = 0.5
# How long the access log's thread waits for more lines before it sleeps
# until woken: the most a line waits in the queue while lines keep coming.
# (The diagnostic log's thread does not linger: its records are rare.)
ACCESS_LOG_LINGER = 0.002
# While lines come fast (BUSY_LINES in one batch, until a batch has fewer
# than QUIET_LINES) it lingers longer: each wake-up takes the GIL from the
# loop, and at 2 ms the thread cost 30-60 us of CPU per request at ~1,400
# requests/s, at 20 ms 5-10 (measured). Sparse lines still wait at most
# 2 ms, so a worker killed just after answering has written its lines.
ACCESS_LOG_BUSY_LINGER = 0.02
BUSY_LINES = 3
QUIET_LINES = 10
# Seconds between two warnings that lines are being dropped.
WARN_INTERVAL = 60.0

log = logging.getLogger(__name__)


class LineWriter:
    """A bounded queue of lines and the thread that writes them to ``fd``.

    ``path``: the file ``fd`` was opened from, reopened by :meth:`reopen`
    (log rotation); ``None`` for stdout and stderr. ``on_drop(n)`` is called
    (from any thread) for every ``n`` lines lost, to a full queue or a failed
    write. ``warn``: log (rate-limited) when lines are lost; off for the
    writer that carries the log itself.
    """

    def __init__(self, fd: int, *, path: str | None = None, owns_fd: bool = False, max_bytes: int,
                 name: str = "line writer", on_drop: Callable[[int], None] | None = None,
                 warn: bool = True, linger: float = 0.0, busy_linger: float | None = None) -> None:
        self.fd = fd
        self.path = path
        self.name = name
        self.max_bytes = max_bytes
        self.linger = linger
        self.busy_linger = linger if busy_linger is None else busy_linger
        self.on_drop = on_drop
        self.dropped = 0  # lines lost: queue full or write failed
        self._owns_fd = owns_fd
        self._warn = warn
        self._warned_at: float | None = None
        self._dropped_at_warning = 0
        self._drop_lock = threading.Lock()
        # put() appends under _put_lock (callers may be several threads); the
        # thread pops without it (deque ends are atomic), so a line costs the
        # caller one uncontended lock and the thread no lock at all.
        self._lines: collections.deque[bytes] = collections.deque()
        self._put_lock = threading.Lock()
        # Each counter has one writer: bytes and lines queued (callers, under
        # _put_lock), taken and finished (the thread), lost at close (close()).
        self._bytes_in = 0
        self._bytes_taken = 0
        self._lines_in = 0
        self._lines_done = 0
        self._lines_lost_closing = 0
        # The thread waits on _wake (held): exactly one release, by whoever
        # finds _waiting set (under _put_lock), wakes it. While it lingers
        # (_lingering) a put() wakes it only when the queue is half full.
        self._wake = threading.Lock()
        self._wake.acquire()
        self._waiting = False
        self._lingering = False
        self._closing = False  # no more lines; write what is queued, then end
        self._abandoned = False  # close() gave up on the sink: end without writing
        self._reopen = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # --- caller side (any thread; never blocks on the sink) -----------------------

    def put(self, line: bytes) -> bool:
        """Queue ``line``; False (and counted) if the queue is full or closed."""
        cost = len(line) + LINE_OVERHEAD
        with self._put_lock:
            if not self._closing and self._bytes_in - self._bytes_taken + cost <= self.max_bytes:
                self._lines.append(line)
                self._bytes_in += cost
                self._lines_in += 1
                if self._waiting and (not self._lingering
                                      or (self._bytes_in - self._bytes_taken) * 2 > self.max_bytes):
                    self._waiting = False
                    self._wake.release()
                return True
        self._count_dropped(1, "the queue is full: the sink does not keep up")
        return False

    def _wake_thread(self) -> None:
        """Wake the thread if it waits, idle or lingering (under _put_lock)."""
        if self._waiting:
            self._waiting = False
            self._wake.release()

    def reopen(self) -> None:
        """Ask the thread to reopen ``path`` (after a rotation moved the file)."""
        if self.path is None:
            return
        with self._put_lock:
            self._reopen = True
            self._wake_thread()

    def close(self, timeout: float) -> bool:
        """Write what is queued, for at most ``timeout`` seconds, and stop.
        False if the sink did not take it all in time: the rest is dropped
        and counted, and the thread is left blocked (it is a daemon)."""
        with self._put_lock:
            if self._closing:
                return not self._abandoned
            self._closing = True
            self._wake_thread()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._abandoned = True
            lost = 0
            while True:  # each line is popped once, here or by the thread
                try:
                    self._lines.popleft()
                except IndexError:
                    break
                lost += 1
            self._lines_lost_closing += lost
            self._count_dropped(lost, f"the sink did not take them within {timeout:g}s of closing")
            return False
        if self._owns_fd:
            os.close(self.fd)
        return True

    @property
    def unwritten(self) -> int:
        """Lines queued or being written."""
        return self._lines_in - self._lines_done - self._lines_lost_closing

    def _count_dropped(self, lines: int, why: str) -> None:
        if lines <= 0:
            return
        with self._drop_lock:
            self.dropped += lines
            now = time.monotonic()
            warn = self._warn and (self._warned_at is None or now - self._warned_at >= WARN_INTERVAL)
            if warn:
                self._warned_at, since, self._dropped_at_warning = now, self._dropped_at_warning, self.dropped
        if warn:
            log.warning("%s: dropping lines, %s (%d dropped since the last warning, %d in all)",
                        self.name, why, self.dropped - since, self.dropped)
        hook = self.on_drop
        if hook is not None:
            try:
                hook(lines)
            except Exception:  # a metrics hook must never fail the caller
                pass

    # --- the writer thread ------------------------------------------------------------

    def _run(self) -> None:
        busy = False
        while True:
            with self._put_lock:
                idle = not self._lines and not self._reopen and not self._closing
                self._waiting, self._lingering = idle, False
            if idle:
                self._wake.acquire()  # a put(), reopen() or close() releases it
            if self._reopen:
                self._reopen = False
                self._reopen_path()
                continue
            if self._abandoned or (self._closing and not self._lines):
                return
            written = self._write_queued()
            busy = written >= (QUIET_LINES if busy else BUSY_LINES)
            linger = self.busy_linger if busy else self.linger
            if linger > 0:
                self._linger(linger)

    def _linger(self, seconds: float) -> None:
        """Stay awake a moment before looking at the queue again: puts do
        not wake a lingering thread (unless the queue is half full), so the
        lines that come meanwhile are written as one batch, the thread
        taking the GIL once for them and put() making no system call."""
        with self._put_lock:
            if self._closing or self._reopen or (self._bytes_in - self._bytes_taken) * 2 > self.max_bytes:
                return
            self._waiting = self._lingering = True
        woken = self._wake.acquire(timeout=seconds)
        with self._put_lock:
            self._lingering = False
            if self._waiting:  # nobody released _wake
                self._waiting = False
            elif not woken:  # released just after the timeout: hold it again
                self._wake.acquire()

    def _write_queued(self) -> int:
        """Write the queued lines, whole lines up to PIPE_BUF bytes per
        write(2) (a longer line alone); the number taken."""
        lines = self._lines
        carried: bytes | None = None
        taken = 0
        while not self._abandoned:
            parts = [] if carried is None else [carried]
            size = 0 if carried is None else len(carried)
            carried = None
            while True:
                try:
                    line = lines.popleft()
                except IndexError:
                    break
                self._bytes_taken += len(line) + LINE_OVERHEAD
                if parts and size + len(line) > select.PIPE_BUF:
                    carried = line
                    break
                parts.append(line)
                size += len(line)
            if not parts:
                return taken
            taken += len(parts)
            try:
                self._write_all(b"".join(parts))
            except OSError as exc:  # a full disk, a closed pipe: the lines go, serving goes on
                self._count_dropped(len(parts), f"write failed: {exc}")
            finally:
                self._lines_done += len(parts)
        if carried is not None:  # abandoned between taking and writing it
            self._lines_done += 1
            self._count_dropped(1, "the writer was abandoned")
        return taken

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.fd, view)
            except BlockingIOError:  # someone made the descriptor non-blocking
                if self._abandoned:
                    raise
                select.select([], [self.fd], [], WRITABLE_POLL)
                continue
            view = view[written:]

    def _reopen_path(self) -> None:
        assert self.path is not None
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            log.error("%s: cannot reopen %s, writing on to the old file: %s", self.name, self.path, exc)
            return
        old, self.fd = self.fd, fd
        if self._owns_fd:
            os.close(old)
        self._owns_fd = True
        log.info("%s: reopened %s", self.name, self.path)


class StderrHandler(logging.Handler):
    """A logging handler that never blocks the thread that logs: records are
    formatted by the caller and written to fd 2 by a :class:`LineWriter`
    (what ``logging.handlers.QueueHandler`` with a bounded queue would do,
    minus its traceback on every drop). Lost records are counted in
    ``writer.dropped`` and reported to the hook of :meth:`count_drops_with`."""

    FLUSH_TIMEOUT = 1.0  # at exit, seconds for a stuck stderr to take the last records
    MAX_QUEUED_BYTES = 256 * 1024

    def __init__(self, fd: int = 2) -> None:
        super().__init__()
        self._stuck = False  # a flush ran out of time: closing need not wait again
        self.writer = LineWriter(fd, max_bytes=self.MAX_QUEUED_BYTES, name="stderr log writer", warn=False)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        if _LINE_BREAKS.search(text):  # a message quoting a client's or an upstream's text
            text = _LINE_BREAKS.sub(lambda found: f"\\u{ord(found.group()):04x}", text)
        self.writer.put((text + "\n").encode("utf-8", "backslashreplace"))

    def count_drops_with(self, hook: Callable[[int], None]) -> None:
        """Report lost records to ``hook(n)`` from now on, and those lost so far."""
        self.writer.on_drop = hook
        if self.writer.dropped:
            hook(self.writer.dropped)

    def flush(self) -> None:
        """Wait (bounded) for the queue to empty: a process about to exit
        writes its last words when stderr takes them."""
        deadline = time.monotonic() + self.FLUSH_TIMEOUT
        while self.writer.unwritten and not self._stuck:
            if time.monotonic() >= deadline:
                self._stuck = True
            time.sleep(0.005)

    def close(self) -> None:
        self.writer.close(0.0 if self._stuck else self.FLUSH_TIMEOUT)
        super().close()


def install_stderr_logging(level: str, fmt: str) -> StderrHandler | None:
    """Log to stderr through a :class:`StderrHandler`, unless the root logger
    already has handlers (as ``logging.basicConfig`` would)."""
    if logging.root.handlers:
        return None
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])
    return handler
