"""Writes due requests at their due time from a process of their own.

Why: the event loop handles the response streams. Under load a server's token tick makes ~100
connections readable at once, and the loop spends a few milliseconds on that burst; a request due
during it would wait for the burst to end (milliseconds of dispatch error). A thread in the same
process is not enough: it shares the GIL with the loop, so each head of a burst waits its turn
for it (tens of microseconds per head, some over 100 us). So the writes happen in a small child process
(``replayer.http.launchproc``: standard library only, ~10 MB) with its own interpreter.

How: the dispatcher binds each request to an idle keep-alive connection ``launch_ahead_ns`` (50 ms)
before its due time, with its bytes built (``Client.reserve``; a hand-over that finds no idle
connection is tried again every 2 ms until the due time). ``Launcher.submit`` copies the bytes
into a ring shared with the child (a 4 MB memory file both map; a request that finds no room
gets a memory file of its own) and sends the child a 32-byte frame with the due time, the
request's place and a copy of the socket's descriptor (``SCM_RIGHTS`` over a Unix socket pair).
The child sleeps to the due time (``poll``, then ``time.sleep``, then a spin over the last
``spin_ns``), writes the head (request line and headers) of every request due by then, then their
bodies (non-blocking: a burst due at one instant starts together, as independent clients would),
closes its descriptors and reports per request the time just before its first byte and the
bytes written; the ring space is free again once that report is read. The child copies from the
ring with ``os.write``: ``sendfile`` from it would be zero-copy, the socket would keep referring
to ring pages after the call returns, and the server would read the next request's bytes in
them. The loop (``Client.on_launched``) records the send and writes what the child could not (a
full socket buffer) through the connection's transport. The child runs at real-time priority
where the OS permits (root or ``CAP_SYS_NICE``: SCHED_FIFO 1, else nice -10). The loop still
reads and measures every response; only the write moves.

Why a shared ring: a hand-over then costs the loop ~70 us (``bench/bench_hotpaths.py``: the copy
~20 us, the ``sendmsg`` most of the rest), about half of what a memory file per request costs,
which keeps the loop out of saturation at hundreds of large requests per second. Dispatch error
with and without the launcher: README, *Performance* (``bench/fidelity/run.sh``).

A request whose connection is closed before its due time is cancelled (``cancel``): the child
drops it and closes its descriptors, so the socket goes away with the loop's. The child exits when
its socket pair closes (the parent stopped or died); it ignores SIGINT and SIGTERM, so the writes
handed over before a drain still go. Linux only (``memfd_create``); elsewhere the loop writes.

Clock: ``replayer.core.clock.now_ns`` (``time.perf_counter_ns``: ``CLOCK_MONOTONIC`` on Linux, one
clock for every process). Over TLS the bytes handed over are the request's TLS records, sealed
by the loop (``replayer.http.tlsrecord``); the child writes them as it writes plain HTTP.
"""

from __future__ import annotations

import array
import asyncio
import errno
import logging
import mmap
import os
import signal
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable

from replayer.http.launchproc import CANCEL, FILE, FRAME, PRIORITIES, REPORT, RING, STOP

log = logging.getLogger("replayer")

#: the loop's handler for a report: (token, sent_ns or 0, bytes written, errno)
Report = Callable[[int, int, int, int], None]


class Launcher:
    """Handle on the launcher child process (parent side, event-loop thread only).

    ``start()`` spawns the child, ``await ready()`` waits for it (``priority`` then says what it
    got: ``fifo``, ``nice`` or ``default``) and ``attach(on_report)`` takes its reports.
    ``submit(at_ns, fd, head, body)`` queues a write of ``head`` then ``body`` (bytes) on a
    duplicate of socket ``fd`` at ``at_ns`` (``now_ns`` clock) and returns its token (int > 0);
    ``on_report(token, sent_ns,
    written, err)`` is called on the loop once the child has written it: ``sent_ns`` the time just
    before its first byte, ``written`` the bytes the socket took (the caller writes the rest),
    ``err`` an errno (then ``written`` is 0 and ``sent_ns`` the attempt's time). ``cancel(token)``
    drops a queued write (no report follows once the child has it). ``stop()`` ends the child;
    queued writes are dropped. ``launched`` counts reports; ``lateness_ns`` is the last one's
    lateness (``take_late_max_ns`` the largest since it was last called); ``ring_misses`` counts
    requests that did not fit in the ``ring_bytes`` ring.
    ``policy``: ``fifo`` (real-time where permitted, else nice -10), ``nice`` or
    ``default``. ``start``/``ready`` raise ``OSError``/``RuntimeError`` when the child cannot run."""

    def __init__(self, *, spin_ns: int = 150_000, priority: str = "fifo", ring_bytes: int = 4 << 20) -> None:
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {PRIORITIES}")
        self._ring = _Ring(ring_bytes)
        self.ring_misses = 0  # requests that did not fit in the ring (each had a memory file)
        self._policy = priority
        self._spin_ns = spin_ns
        self.priority = "default"
        self.launched = 0
        self.lateness_ns = 0
        self._late_max_ns = 0  # the largest lateness since take_late_max_ns last read it
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_report: Report | None = None
        self._token = 0
        self._due: dict[int, int] = {}  # token -> due time, for lateness
        self._out: deque[tuple[memoryview, list[int]]] = deque()  # frames the socket did not take yet
        self._in = bytearray()
        self._writing = False

    def start(self) -> None:
        """Spawn the child; returns at once (``ready`` waits for it: spawn it early, so its
        start-up, ~50 ms, overlaps other work). Raises ``OSError`` where it cannot run."""
        if not hasattr(os, "memfd_create"):
            raise OSError("the launcher needs memfd_create (Linux)")
        ring = self._ring
        ring_fd = ring.open()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "replayer.http.launchproc",
                    str(child.fileno()),
                    str(ring_fd),
                    str(ring.size),
                    str(self._spin_ns),
                    self._policy,
                ],
                pass_fds=(child.fileno(), ring_fd),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            parent.close()
            ring.close()
            raise
        finally:
            child.close()
            os.close(ring_fd)
        parent.setblocking(False)
        self._sock = parent

    async def ready(self, timeout_s: float = 30.0) -> None:
        """Wait until the child runs (``priority`` then says what it got)."""
        self._loop = loop = asyncio.get_running_loop()
        try:
            hello = await asyncio.wait_for(loop.sock_recv(self._sock, REPORT.size), timeout_s)  # type: ignore[arg-type]
        except asyncio.TimeoutError:
            self.stop()
            raise RuntimeError(f"the launcher process did not start within {timeout_s:g} s") from None
        if len(hello) < REPORT.size:  # (a report is 32 bytes: one recv gets it whole)
            self.stop()
            raise RuntimeError(f"the launcher process exited at start (status {self._proc.wait()})")  # type: ignore[union-attr]
        self.priority = PRIORITIES[REPORT.unpack(hello)[2]]

    def attach(self, on_report: Report) -> None:
        """Deliver reports to ``on_report`` (on the loop ``ready`` ran on) from now on."""
        self._on_report = on_report
        self._loop.add_reader(self._sock, self._read)  # type: ignore[union-attr,arg-type]

    @property
    def running(self) -> bool:
        return self._sock is not None

    def pending(self) -> int:
        """Writes submitted and not yet reported or cancelled."""
        return len(self._due)

    def submit(self, at_ns: int, fd: int, head: bytes, body: bytes) -> int:
        if self._sock is None:
            raise RuntimeError("the launcher process is not running")
        self._token += 1
        token = self._token
        self._due[token] = at_ns
        # the bytes go in the shared ring, not through the socket pair (a burst of 12k-token
        # requests, ~70 KB each, would fill it); a memory file of their own when it is full
        size = len(head) + len(body)
        offset = self._ring.put(token, head, body)
        if offset >= 0:
            self._send(FRAME.pack(RING, token, at_ns, len(head), size, offset), [fd])
            return token
        self.ring_misses += 1
        own = os.memfd_create("replayer-request", os.MFD_CLOEXEC)
        try:
            for part in (head, body):
                view, done = memoryview(part), 0
                while done < len(part):
                    done += os.write(own, view[done:])
            self._send(FRAME.pack(FILE, token, at_ns, len(head), size, 0), [fd, own])
        finally:
            os.close(own)
        return token

    def take_late_max_ns(self) -> int:
        """The largest lateness of a write (time past its due time) since the last call."""
        late, self._late_max_ns = self._late_max_ns, 0
        return late

    def cancel(self, token: int) -> None:
        """Drop a queued write."""
        if self._due.pop(token, None) is not None and self._sock is not None:
            self._send(FRAME.pack(CANCEL, token, 0, 0, 0, 0), [])

    def stop(self) -> None:
        sock, proc = self._sock, self._proc
        self._sock = None
        if sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(sock)
                if self._writing:
                    self._loop.remove_writer(sock)
            for _, fds in self._out:  # (queued descriptors are our own duplicates)
                for fd in fds:
                    os.close(fd)
            self._out.clear()
            try:
                sock.send(FRAME.pack(STOP, 0, 0, 0, 0, 0))
            except OSError:
                pass
            sock.close()  # the child exits on either
        self._ring.close()
        if proc is not None:
            try:
                proc.wait(2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._due.clear()

    # -- channel -------------------------------------------------------------------------------
    def _send(self, frame: bytes, fds: list[int]) -> None:
        """Send one frame with ``fds`` attached to its first byte: straight into the socket when
        nothing is queued (the kernel takes its own references), else queued (with duplicates
        of ``fds``, which the caller may close) for ``_flush``."""
        if self._sock is None:
            raise RuntimeError("the launcher process is not running")
        view = memoryview(frame)
        if not self._out:
            n = _sendmsg(self._sock, view, fds)
            if n < 0 or n == len(view):  # (gone: _read fails what it held)
                return
            view = view[n:]
            if n:
                fds = []
        self._out.append((view, [os.dup(fd) for fd in fds]))
        if not self._writing:
            self._writing = True
            self._loop.add_writer(self._sock, self._flush)  # type: ignore[union-attr]

    def _flush(self) -> None:
        out, sock = self._out, self._sock
        while out and sock is not None:
            view, fds = out[0]
            n = _sendmsg(sock, view, fds)
            if n < 0:  # the child is gone: _read sees it and fails what was queued
                return
            if n and fds:
                for fd in fds:
                    os.close(fd)  # the child has its own copies now
                fds = []
            if n < len(view):
                out[0] = (view[n:], fds)
                return
            out.popleft()
        if self._writing and sock is not None:
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
            proc = self._proc
            self.stop()
            log.error(
                "the launcher process (pid %s) died mid-run (%s): the %d requests it held failed; the rest of the "
                "run writes its requests from the event loop (their send times less exact: the self-watch says "
                "if it falls behind)",
                proc.pid if proc is not None else "?",
                _exit_status(proc.returncode if proc is not None else None),
                len(lost),
            )
            for token in lost:
                self._on_report(token, 0, 0, errno.ECHILD)  # type: ignore[misc]
            return
        buf = self._in
        buf += data
        n = len(buf) // REPORT.size * REPORT.size
        due, on_report, ring = self._due, self._on_report, self._ring
        for token, sent, written, err in REPORT.iter_unpack(memoryview(buf)[:n]):
            ring.release(token)  # (every write is reported once: written, failed or cancelled)
            at = due.pop(token, None)
            if at is None:  # cancelled
                continue
            self.launched += 1
            if sent:
                self.lateness_ns = late = sent - at
                if late > self._late_max_ns:
                    self._late_max_ns = late
            on_report(token, sent, written, err)  # type: ignore[misc]
        del buf[:n]


def _exit_status(code: int | None) -> str:
    """A child's return code in words: 'killed by SIGKILL', 'exit 1'."""
    if code is None:
        return "status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


class _Ring:
    """Request bytes shared with the child: a memory file of ``size`` bytes mapped by both.
    ``put(token, head, body)`` copies a request in and returns its offset (-1: no room);
    ``release(token)`` frees it once the child has reported on it. Space is taken in a circle
    and freed in the order it was taken (the dispatcher hands requests over in due order, ~50 ms
    ahead), so a region released early waits for the older ones before it is reused."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None
        # [token, start, end, released (a bool)], in the order taken
        self._taken: deque[list[int]] = deque()
        self._by_token: dict[int, list[int]] = {}
        self._head = 0  # where the next region starts, if it fits

    def open(self) -> int:
        """Create and map the memory file; returns its descriptor (the caller closes it)."""
        fd = os.memfd_create("replayer-ring", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, self.size)
            self._map = mmap.mmap(fd, self.size)
        except BaseException:
            os.close(fd)
            raise
        self._view = memoryview(self._map)
        return fd

    def close(self) -> None:
        if self._map is not None:
            self._view.release()  # type: ignore[union-attr]
            self._map.close()
            self._map = self._view = None
        self._taken.clear()
        self._by_token.clear()
        self._head = 0

    def put(self, token: int, head: bytes, body: bytes) -> int:
        n = len(head) + len(body)
        taken, view = self._taken, self._view
        if view is None or n > self.size:
            return -1
        if not taken:
            start = 0
        else:
            tail, end = taken[0][1], self._head
            if end > tail:  # free: [end, size) and [0, tail)
                start = end if self.size - end >= n else 0 if tail >= n else -1
            else:  # wrapped (or full): free is [end, tail)
                start = end if tail - end >= n else -1
            if start < 0:
                return -1
        mid = start + len(head)
        view[start:mid] = head
        view[mid : start + n] = body
        self._head = start + n
        region = [token, start, start + n, False]
        taken.append(region)
        self._by_token[token] = region
        return start

    def release(self, token: int) -> None:
        region = self._by_token.pop(token, None)
        if region is None:
            return
        region[3] = True
        taken = self._taken
        while taken and taken[0][3]:
            taken.popleft()
        if not taken:
            self._head = 0


def _sendmsg(sock: socket.socket, data: memoryview, fds: list[int]) -> int:
    """Bytes of ``data`` the non-blocking ``sock`` took (with ``fds`` attached); -1 when the
    peer is gone."""
    try:
        if fds:
            return sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        return sock.send(data)
    except (BlockingIOError, InterruptedError):
        return 0
    except OSError:
        return -1


_NO_LAUNCHER = "the launcher process failed to start (%s); the event loop writes every request"


def start_launcher() -> Launcher | None:
    """A launcher process started (ready later: ``launcher_ready``), or None (logged) when it cannot start."""
    launcher = Launcher()
    try:
        launcher.start()
    except OSError as e:
        log.warning(_NO_LAUNCHER, e)
        return None
    return launcher


async def launcher_ready(launcher: Launcher) -> Launcher | None:
    """``launcher`` once ready, or None (logged): the event loop then writes every request."""
    try:
        await launcher.ready()
    except (OSError, RuntimeError) as e:
        log.warning(_NO_LAUNCHER, e)
        return None
    log.info("launcher process started (%s priority)", launcher.priority)
    return launcher
