"""OpenSSL's key log of a client ``SSLContext``, read inside the process, each secret bound to its
connection by the client random of that connection's ClientHello.

Why by identity: the record sealer (``replayer.http.tlsrecord``) seals a connection's requests
with the client application traffic secret it finds here. Taking "the last secret logged" after
a handshake step would be right only as long as every handshake on the context ran on one
thread, one at a time; a handshake from anywhere else (a probe, a scrape, a thread) with this
connection's own line missing would give two connections one key and one nonce sequence: nonce
reuse under AES-GCM. So a connection registers its client random (``expect``) when its
ClientHello is written, and takes the secret logged for that random (``secret``); a line for a
random nobody expects is ignored (counted: ``ignored``), and a connection whose line is not there
gets no secret (it is never sealed).

Why a thread: OpenSSL writes the lines into a pipe (the secrets never touch a disk), from
inside the handshake call, with a blocking write. Were the event loop the pipe's only reader, a
pipe filled by handshakes it does not drive would block that write on the loop thread for good.
A daemon thread waits on the pipe and drains it as lines come (Python's ``ssl`` writes the
line with the GIL released, so the thread can run while the writer waits); ``secret`` drains it
too, under the same lock, so a line written by the call that just completed a handshake is
found at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import ssl
import threading

_PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_LABEL = "CLIENT_TRAFFIC_SECRET_0"
#: the most client randoms waiting for their line (a connection that never completes its
#: handshake and is never forgotten cannot grow the table without bound)
_MAX_EXPECTED = 65536


class KeyLog:
    """OpenSSL's key log of ``ctx`` into a pipe this process reads. ``expect(random)`` before the
    handshake's secrets are logged, ``secret(random)`` after it completed (None: no line for that
    connection), ``forget(random)`` when it failed. A key log the context already had
    (``SSLKEYLOGFILE``, for a packet capture) still gets every line."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self._tee = ctx.keylog_filename
        self._ctx = ctx
        self._lock = threading.Lock()
        self._expected: dict[bytes, bytes | None] = {}  # client random -> its secret (None: not logged yet)
        self._partial = b""  # a line not yet whole
        self.ignored = 0  # secrets logged for no connection this log expects
        self._thread: threading.Thread | None = None
        r, w = os.pipe()
        with contextlib.suppress(OSError):
            fcntl.fcntl(w, _F_SETPIPE_SZ, _PIPE_BYTES)
        os.set_blocking(r, False)
        try:
            ctx.keylog_filename = f"/proc/self/fd/{w}"  # (OpenSSL opens its own descriptor of the pipe)
        except (OSError, AttributeError, NotImplementedError):  # (no /proc, or an OpenSSL without key logs)
            os.close(r)
            r = -1
        finally:
            os.close(w)
        self._r = r
        self._stop_r, self._stop_w = os.pipe() if r >= 0 else (-1, -1)
        if r >= 0:
            self._thread = threading.Thread(target=self._drain_forever, name="replayer-keylog", daemon=True)
            self._thread.start()

    @property
    def available(self) -> bool:
        """Whether secrets can be had at all (OpenSSL logs into the pipe)."""
        return self._r >= 0

    def expect(self, client_random: bytes) -> None:
        """A connection whose ClientHello carries ``client_random`` is handshaking: keep its line."""
        with self._lock:
            if len(self._expected) < _MAX_EXPECTED:
                self._expected[client_random] = None

    def forget(self, client_random: bytes) -> None:
        with self._lock:
            self._expected.pop(client_random, None)

    def secret(self, client_random: bytes) -> bytes | None:
        """The client application traffic secret logged for ``client_random`` (then forgotten),
        or None when no line carries it."""
        with self._lock:
            self._drain()
            return self._expected.pop(client_random, None)

    def _drain(self) -> None:
        """Read what the pipe holds (the lock held) and keep the secrets expected."""
        if self._r < 0:
            return
        chunks = [self._partial] if self._partial else []
        while True:
            try:
                chunk = os.read(self._r, _PIPE_BYTES)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        data = b"".join(chunks)
        if not data:
            return
        end = data.rfind(b"\n") + 1
        self._partial, whole = data[end:], data[:end]
        if not whole:
            return
        text = whole.decode("ascii", "replace")
        if self._tee:
            with contextlib.suppress(OSError), open(self._tee, "a") as f:
                f.write(text)
        expected = self._expected
        for line in text.splitlines():
            parts = line.split()
            if len(parts) != 3 or parts[0] != _LABEL:
                continue
            try:
                random, secret = bytes.fromhex(parts[1]), bytes.fromhex(parts[2])
            except ValueError:
                continue
            if random in expected:
                expected[random] = secret
            else:
                self.ignored += 1

    def _drain_forever(self) -> None:
        """The thread: drain the pipe whenever OpenSSL writes to it, until ``close``."""
        poll = select.poll()
        poll.register(self._r, select.POLLIN)
        poll.register(self._stop_r, select.POLLIN)
        while True:
            events = poll.poll()
            if any(fd == self._stop_r for fd, _ in events):
                return
            with self._lock:
                self._drain()
            if any(ev & (select.POLLHUP | select.POLLERR) and not ev & select.POLLIN for _, ev in events):
                return  # (OpenSSL closed its end: nothing more will come)

    def close(self) -> None:
        """Stop logging (OpenSSL closes its end of the pipe), stop the thread, close this end."""
        if self._r < 0:
            return
        with contextlib.suppress(Exception):
            self._ctx.keylog_filename = None  # type: ignore[assignment]
        os.write(self._stop_w, b"x")
        if self._thread is not None:
            self._thread.join(5)
        for fd in (self._r, self._stop_r, self._stop_w):
            os.close(fd)
        self._r = self._stop_r = self._stop_w = -1
