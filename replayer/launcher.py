"""Writes due requests at their due time from a process of their own.

Why: the event loop handles the response streams. Under load a server's token tick makes ~100
connections readable at once, and the loop spends a few milliseconds on that burst; a request due
during it would wait for the burst to end (dispatch error p99 ~4 ms on issue 7's workload). A
thread in the same process is not enough: it shares the GIL with the loop, and each head of a
burst waited its turn for it (the median gap between two heads of a burst was 30 us, ~10 us of it
GIL hand-over, and one gap in 14 was over 100 us). So the writes happen in a small child process
(``replayer.launchproc``: standard library only, ~10 MB) with its own interpreter.

How: the dispatcher binds each request to an idle keep-alive connection ``launch_ahead_ns`` (50 ms)
before its due time, with its bytes built (``Client.reserve``), and ``Launcher.submit`` sends the
child a frame: the due time, the request's bytes and a duplicate of the socket's descriptor
(``SCM_RIGHTS`` over a Unix socket pair). The child sleeps to the due time (``poll``, then
``time.sleep``, then a spin over the last ``spin_ns``), writes the head (request line and headers)
of every request due by then, then their bodies (non-blocking: a burst due at one instant starts
together, as independent clients would), closes its descriptors and reports per request the time
just before its first byte and the bytes written. The loop (``Client``) records the send and
writes what the child could not (a full socket buffer) through the connection's transport. The
child runs at real-time priority where the OS permits (root or ``CAP_SYS_NICE``: SCHED_FIFO 1,
else nice -10). The loop still reads and measures every response; only the write moves.

A request whose connection is closed before its due time is cancelled (``cancel``): the child
drops it and closes its descriptor, so the socket goes away with the loop's. The child exits when
its socket pair closes (the parent stopped or died).

Clock: ``replayer.clock.now_ns`` (``time.perf_counter_ns``: ``CLOCK_MONOTONIC`` on Linux, one
clock for every process). POSIX systems with descriptor passing; plain HTTP only (TLS bytes must
go through the transport's SSL object).
"""

from __future__ import annotations

import array
import asyncio
import errno
import os
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable

from .launchproc import CANCEL, FRAME, PRIORITIES, REPORT, STOP, WRITE

#: the loop's handler for a report: (token, sent_ns or 0, bytes written, errno)
Report = Callable[[int, int, int, int], None]


class Launcher:
    """Handle on the launcher child process (parent side, event-loop thread only).

    ``await start(on_report)`` spawns the child and waits for it (``priority`` then says what it
    got: ``fifo``, ``nice`` or ``default``). ``submit(at_ns, fd, data, head_len)`` queues a write
    of ``data`` (bytes: head of ``head_len`` bytes, then body) on a duplicate of socket ``fd`` at
    ``at_ns`` (``now_ns`` clock) and returns its token (int > 0); ``on_report(token, sent_ns,
    written, err)`` is called on the loop once the child has written it: ``sent_ns`` the time just
    before its first byte, ``written`` the bytes the socket took (the caller writes the rest),
    ``err`` an errno (then ``written`` is 0 and ``sent_ns`` the attempt's time). ``cancel(token)``
    drops a queued write (no report follows once the child has it). ``stop()`` ends the child;
    queued writes are dropped. ``launched`` counts reports; ``lateness_ns`` is the last one's
    lateness. ``policy``: ``fifo`` (real-time where permitted, else nice -10), ``nice`` or
    ``default``. Raises ``OSError``/``RuntimeError`` from ``start`` when the child cannot run."""

    def __init__(self, *, spin_ns: int = 150_000, priority: str = "fifo") -> None:
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {PRIORITIES}")
        self._policy = priority
        self._spin_ns = spin_ns
        self.priority = "default"
        self.launched = 0
        self.lateness_ns = 0
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_report: Report | None = None
        self._token = 0
        self._due: dict[int, int] = {}  # token -> due time, for lateness
        self._out: deque[tuple[memoryview, int]] = deque()  # frames the socket did not take yet
        self._in = bytearray()
        self._writing = False

    async def start(self, on_report: Report, timeout_s: float = 30.0) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "replayer.launchproc", str(child.fileno()), str(self._spin_ns),
                 self._policy], pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
        finally:
            child.close()
        parent.setblocking(False)
        self._sock, self._on_report = parent, on_report
        self._loop = loop = asyncio.get_running_loop()
        try:
            hello = await asyncio.wait_for(loop.sock_recv(parent, REPORT.size), timeout_s)
        except asyncio.TimeoutError:
            self.stop()
            raise RuntimeError(f"the launcher process did not start within {timeout_s:g} s") from None
        if len(hello) < REPORT.size:  # (a report is 32 bytes: one recv gets it whole)
            self.stop()
            raise RuntimeError(f"the launcher process exited at start (status {self._proc.wait()})")
        self.priority = PRIORITIES[REPORT.unpack(hello)[2]]
        loop.add_reader(parent, self._read)

    @property
    def running(self) -> bool:
        return self._sock is not None

    def pending(self) -> int:
        """Writes submitted and not yet reported or cancelled."""
        return len(self._due)

    def submit(self, at_ns: int, fd: int, data: bytes, head_len: int) -> int:
        self._token += 1
        token = self._token
        self._due[token] = at_ns
        dup = os.dup(fd)  # the loop may close ``fd`` (and reuse its number) before the frame goes
        self._send(FRAME.pack(WRITE, token, at_ns, head_len, len(data)) + data, dup)
        return token

    def cancel(self, token: int) -> None:
        if self._due.pop(token, None) is not None and self._sock is not None:
            self._send(FRAME.pack(CANCEL, token, 0, 0, 0), -1)

    def stop(self) -> None:
        sock, proc = self._sock, self._proc
        self._sock = None
        if sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(sock)
                if self._writing:
                    self._loop.remove_writer(sock)
            for _, fd in self._out:
                if fd >= 0:
                    os.close(fd)
            self._out.clear()
            try:
                sock.send(FRAME.pack(STOP, 0, 0, 0, 0))
            except OSError:
                pass
            sock.close()  # the child exits on either
        if proc is not None:
            try:
                proc.wait(2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._due.clear()

    # -- channel -------------------------------------------------------------------------------
    def _send(self, frame: bytes, fd: int) -> None:
        if self._sock is None:
            if fd >= 0:
                os.close(fd)
            raise RuntimeError("the launcher process is not running")
        self._out.append((memoryview(frame), fd))
        if not self._writing:
            self._flush()

    def _flush(self) -> None:
        out, sock = self._out, self._sock
        while out and sock is not None:
            view, fd = out[0]
            try:
                if fd >= 0:
                    n = sock.sendmsg([view], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
                else:
                    n = sock.send(view)
            except BlockingIOError:
                n = 0
            except OSError:  # the child is gone: _read sees it and fails what was queued
                return
            if n and fd >= 0:
                os.close(fd)  # the child has its own copy now
                fd = -1
            if n < len(view):
                out[0] = (view[n:], fd)
                if not self._writing:
                    self._writing = True
                    self._loop.add_writer(sock, self._flush)  # type: ignore[union-attr]
                return
            out.popleft()
        if self._writing:
            self._writing = False
            self._loop.remove_writer(sock)  # type: ignore[union-attr]

    def _read(self) -> None:
        sock = self._sock
        try:
            data = sock.recv(1 << 16)  # type: ignore[union-attr]
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the child died: every write it held fails
            lost = list(self._due)
            self.stop()
            for token in lost:
                self._on_report(token, 0, 0, errno.ECHILD)  # type: ignore[misc]
            return
        buf = self._in
        buf += data
        n = len(buf) // REPORT.size * REPORT.size
        due, on_report = self._due, self._on_report
        for token, sent, written, err in REPORT.iter_unpack(memoryview(buf)[:n]):
            at = due.pop(token, None)
            if at is None:  # cancelled meanwhile
                continue
            self.launched += 1
            if sent:
                self.lateness_ns = sent - at
            on_report(token, sent, written, err)  # type: ignore[misc]
        del buf[:n]
