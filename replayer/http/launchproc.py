"""The launcher's child process: ``python -m replayer.http.launchproc FD RING_FD RING_BYTES SPIN_NS POLICY``.

It receives requests with their due times and socket descriptors from the parent
(``replayer.http.launcher.Launcher``) over the Unix socket ``FD``, writes each at its due time and
reports back. A request's bytes wait in the shared ring ``RING_FD`` (a memory file the parent
writes and this process maps read-only; written with ``os.write``, a copy, because ``sendfile``
from it would let the socket keep referring to ring pages the parent reuses), or, when the ring
is full, in a memory file of their own (sent with ``sendfile``: that file never changes).
Standard library only, so it starts in ~30 ms and stays ~10 MB; the wire format
(``FRAME``/``REPORT``) is defined here. See ``replayer.http.launcher`` for the why and the protocol.
"""

from __future__ import annotations

import array
import errno
import heapq
import mmap
import os
import select
import signal
import socket
import struct
import sys
import time
from collections import deque

now_ns = time.perf_counter_ns  # = replayer.core.clock.now_ns (CLOCK_MONOTONIC, shared by processes)

# parent -> child: kind, token, due time (ns, now_ns clock), head length, request length, ring
# offset. A RING frame's first byte carries one descriptor (SCM_RIGHTS), the connection's
# socket, and its request is at the offset in the ring; a FILE frame's carries two: the socket
# and a memory file holding the request.
FRAME = struct.Struct("<BxxxQqIII")
RING, FILE, CANCEL, STOP = 1, 2, 3, 4
# child -> parent: token, time just before the first byte (ns), bytes written, errno (0 = none);
# a cancelled write is reported too (ECANCELED; the parent ignores it)
REPORT = struct.Struct("<Qqqi4x")
HELLO = 0  # token of the child's first report: its "bytes written" is the priority obtained
PRIORITIES = ("default", "nice", "fifo")
_MAX_FDS = 256  # descriptors one recvmsg takes
# a request queued in the child: socket, memory file (-1: in the ring), head length, request
# length, ring offset
_Item = tuple[int, int, int, int, int]


def _raise_priority(policy: str) -> int:
    """Where the OS permits it (root or CAP_SYS_NICE), run above ordinary processes, so the
    scheduler wakes this one on time on a busy machine: real-time SCHED_FIFO priority 1 (it sleeps
    between writes and spins at most ``spin_ns``), else nice -10. Returns the index in
    ``PRIORITIES`` of what it got."""
    order = {"fifo": ("fifo", "nice"), "nice": ("nice",)}.get(policy, ())
    for p in order:
        try:
            if p == "fifo":
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
            else:
                os.setpriority(os.PRIO_PROCESS, 0, -10)
        except (AttributeError, OSError):
            continue
        return PRIORITIES.index(p)
    return 0


class _Child:
    """The child's state: frames received and not yet due (a heap of (due, token) and a dict
    token -> write)."""

    def __init__(self, sock: socket.socket, ring: memoryview, spin_ns: int) -> None:
        self.sock = sock
        self.ring = ring
        self.spin_ns = spin_ns
        self.heap: list[tuple[int, int]] = []
        # token -> (socket, memory file holding the request or -1 (ring), head length, request
        # length, offset in the ring)
        self.live: dict[int, _Item] = {}
        self.fds: deque[int] = deque()  # descriptors received, not yet matched to their frame
        self.hdr = memoryview(bytearray(FRAME.size))  # the frame header being read
        self.got = 0  # bytes of it read so far
        self.poll = select.poll()
        self.poll.register(sock, select.POLLIN)
        self.anc = socket.CMSG_SPACE(_MAX_FDS * 4)

    def run(self) -> None:
        heap, spin = self.heap, self.spin_ns
        while True:
            while heap and heap[0][1] not in self.live:  # cancelled
                heapq.heappop(heap)
            left = heap[0][0] - now_ns() if heap else -1
            if not heap or left > 2_000_000:
                # poll has ms resolution: wake 1-2 ms early, then sleep finely and spin
                if self.poll.poll(-1 if not heap else (left - 1_000_000) // 1_000_000) and not self.read():
                    return
            elif left > spin:
                if self.poll.poll(0) and not self.read():
                    return
                time.sleep((left - spin) / 1e9)  # overshoots by ~60 us: the spin absorbs it
            else:
                at = heap[0][0]
                while now_ns() < at:  # the last ~0.15 ms
                    pass
                self.fire()

    def read(self) -> bool:
        """Take the frames the parent sent, without blocking; False at its end (stop frame or
        closed socket). A frame's descriptors come with its first byte; headers are read one at
        a time, so each read stops at a frame boundary."""
        sock, hdr = self.sock, self.hdr
        while True:
            try:
                n, anc, _, _ = sock.recvmsg_into([hdr[self.got :]], self.anc, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return True
            if not n:
                return False
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = array.array("i")
                    got.frombytes(cdata[: len(cdata) - len(cdata) % got.itemsize])
                    self.fds.extend(got)
            self.got += n
            if self.got < FRAME.size:
                continue
            self.got = 0
            kind, token, at, head_len, size, offset = FRAME.unpack_from(hdr)
            if kind == RING or kind == FILE:
                fds = self.fds
                self.live[token] = (fds.popleft(), fds.popleft() if kind == FILE else -1, head_len, size, offset)
                heapq.heappush(self.heap, (at, token))
            elif kind == CANCEL:
                item = self.live.pop(token, None)
                if item is not None:
                    self.release(item)
                    sock.sendall(REPORT.pack(token, 0, 0, errno.ECANCELED))
            else:
                return False

    def release(self, item: _Item) -> None:
        os.close(item[0])
        if item[1] >= 0:
            os.close(item[1])

    def write(self, item: _Item, start: int, end: int) -> int:
        """Write bytes ``start:end`` of a request to its socket, without blocking: the count
        written (``BlockingIOError``/``OSError`` propagate)."""
        fd, src, _, _, offset = item
        if src < 0:
            return os.write(fd, self.ring[offset + start : offset + end])
        return os.sendfile(fd, src, start, end - start)

    def fire(self) -> None:
        """Write every request due by now: all heads first, then the bodies; then report."""
        heap, live = self.heap, self.live
        started: list[tuple[int, int, _Item, int, int]] = []
        while heap and heap[0][0] <= now_ns():
            token = heapq.heappop(heap)[1]
            item = live.pop(token, None)
            if item is None:
                continue
            err = 0
            sent = now_ns()
            try:
                n = self.write(item, 0, item[2])
            except BlockingIOError:
                n = 0
            except OSError as e:
                n, err = 0, e.errno or errno.EIO
            started.append((token, sent, item, n, err))
        reports = []
        for token, sent, item, n, err in started:
            if not err and n == item[2] < item[3]:  # (a short head: the parent writes the rest)
                try:
                    n += self.write(item, n, item[3])
                except BlockingIOError:
                    pass
                except OSError as e:
                    n, err = 0, e.errno or errno.EIO
            self.release(item)
            reports.append(REPORT.pack(token, sent, n, err))
        self.sock.sendall(b"".join(reports))


def main(argv: list[str]) -> int:
    fd, ring_fd, ring_bytes, spin_ns, policy = int(argv[0]), int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
    ring = memoryview(mmap.mmap(ring_fd, ring_bytes, prot=mmap.PROT_READ))
    os.close(ring_fd)  # (the mapping stays)
    # a Ctrl-C or a SIGTERM to the whole group must not drop the writes handed over before the
    # parent's drain: the child ends when the parent closes the socket pair (or dies)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    got = _raise_priority(policy)
    sock.sendall(REPORT.pack(HELLO, 0, got, 0))
    try:
        _Child(sock, ring, spin_ns).run()
    except (BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
