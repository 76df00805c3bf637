"""The kernel's receive stamps, on the monotonic clock, on both sides of the capture proxy.

A socket with ``SO_TIMESTAMPNS`` on, read with ``recvmsg``, gets the kernel's receive time of the
data with it (of the newest segment the read took; on loopback, taken during the sender's own
write). The stamp is on the wall clock; ``kernel_stamp_ns`` moves it to ``time.perf_counter_ns``
with the two clocks' offset sampled at the read. The proxy uses these stamps for a request's
arrival (``downstream``) and for the time each piece of a request or a response spent inside the
proxy: from its arrival at the proxy to its write to the next hop (``relay``,
``metrics.ForwardDelay``). A loop that falls behind delays the write, not the stamp, so that time
includes every wait in the proxy: its turn on the event loop, on the GIL, on a CPU.

``StampedTransport`` (``replayer record --stamp-responses``): plain-TCP upstream connections
driven by the loop's reader and writer callbacks, not asyncio transports (which read with
``recv``: no stamp); ~3-4 us more CPU per read than uvloop's transport, so opt-in. TLS upstreams
keep asyncio's transport, unstamped.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import time

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TS = struct.Struct("qq")
_SOL_SOCKET = socket.SOL_SOCKET
READ = 256 * 1024  # bytes one read takes (both sides of the proxy)


class _ClockOffset:
    """Wall clock minus monotonic clock, from a tight sample (monotonic, wall, monotonic less than
    ``TIGHT_NS`` apart: not preempted in between, which on a busy host can take tens of ms) taken
    again every ``REFRESH_NS``; the two clocks drift apart by parts per million at most."""

    TIGHT_NS = 20_000
    REFRESH_NS = 1_000_000_000

    def __init__(self) -> None:
        self.offset = 0
        self.taken = -self.REFRESH_NS
        self.get()

    def get(self) -> int:
        now = time.perf_counter_ns()
        if now - self.taken >= self.REFRESH_NS:
            for _ in range(5):
                a = time.perf_counter_ns()
                w = time.time_ns()
                b = time.perf_counter_ns()
                if b - a <= self.TIGHT_NS:
                    self.offset, self.taken = w - (a + b) // 2, b
                    break
        return self.offset


_CLOCKS = _ClockOffset()


def kernel_stamp_ns(ancdata) -> int | None:
    """The ``SCM_TIMESTAMPNS`` of a ``recvmsg`` on the monotonic clock, or None."""
    for level, typ, data in ancdata:
        if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = _TS.unpack_from(data)
            return sec * 1_000_000_000 + nsec - _CLOCKS.get()
    return None


class StampedTransport:
    """A plain TCP connection for an ``asyncio.Protocol`` (the part of the transport interface
    ``relay.UpstreamConnection`` uses), read with ``recvmsg``: before each ``data_received``,
    ``stamp_ns`` is the kernel's receive time of the newest bytes in it (the read's time if the
    kernel gave none; ``unstamped`` counts those). One read per readiness, as asyncio's transports
    do. Writes go straight to the socket; what it does not take waits for writability."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: asyncio.Protocol) -> None:
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._recvmsg = sock.recvmsg
        self._protocol = protocol
        self._wbuf: collections.deque[bytes] = collections.deque()
        self._reading = True
        self._closing = False
        self._closed = False
        self.stamp_ns = 0
        self.unstamped = 0
        protocol.connection_made(self)  # type: ignore[arg-type]
        if not self._closing:
            loop.add_reader(self._fd, self._on_readable)

    def get_extra_info(self, name: str, default=None):
        return self._sock if name == "socket" else default

    # -- reading --------------------------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            data, anc, _flags, _addr = self._recvmsg(READ, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._lost(e)
            return
        if not data:  # the upstream closed its side (asyncio: eof_received, then close)
            self._lost(None)
            return
        # (kernel_stamp_ns inlined: this runs once per streamed event)
        if len(anc) == 1 and anc[0][0] == _SOL_SOCKET and anc[0][1] == SO_TIMESTAMPNS and len(anc[0][2]) >= 16:
            sec, nsec = _TS.unpack_from(anc[0][2])
            self.stamp_ns = sec * 1_000_000_000 + nsec - _CLOCKS.get()
        else:
            t = kernel_stamp_ns(anc)
            if t is None:
                t = time.perf_counter_ns()
                self.unstamped += 1
            self.stamp_ns = t
        self._protocol.data_received(data)

    def pause_reading(self) -> None:
        if self._reading and not self._closed:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if not self._reading and not self._closed:
            self._reading = True
            self._loop.add_reader(self._fd, self._on_readable)

    def is_reading(self) -> bool:
        return self._reading and not self._closed

    # -- writing --------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self._closing:
            return
        if not self._wbuf:
            try:
                n = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                self._lost(e, soon=True)  # (not inside the writer's own call)
                return
            if n == len(data):
                return
            data = data[n:]
            self._loop.add_writer(self._fd, self._on_writable)
        self._wbuf.append(data)

    def _on_writable(self) -> None:
        while self._wbuf:
            chunk = self._wbuf[0]
            try:
                n = self._sock.send(chunk)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._lost(e)
                return
            if n < len(chunk):
                self._wbuf[0] = chunk[n:]
                return
            self._wbuf.popleft()
        self._loop.remove_writer(self._fd)
        if self._closing:
            self._shut(None, soon=False)

    # -- closing --------------------------------------------------------------------------------
    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Close once what is written has gone out; ``connection_lost(None)`` follows."""
        if self._closing:
            return
        self._closing = True
        if self._reading:
            self._loop.remove_reader(self._fd)
        if not self._wbuf:
            self._shut(None, soon=True)

    def abort(self) -> None:
        """Close now, dropping what waits to be written; ``connection_lost(None)`` follows."""
        self._closing = True
        self._wbuf.clear()
        self._shut(None, soon=True)

    def _lost(self, exc: Exception | None, soon: bool = False) -> None:
        self._closing = True
        self._wbuf.clear()
        self._shut(exc, soon)

    def _shut(self, exc: Exception | None, soon: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        try:
            self._sock.close()
        except OSError:
            pass
        if soon:  # (as asyncio's transports do: never from inside the caller's own call)
            self._loop.call_soon(self._protocol.connection_lost, exc)
        else:
            self._protocol.connection_lost(exc)


async def open_stamped(host: str, port: int, protocol_factory) -> asyncio.Protocol:
    """Connect to ``host:port`` (each address it resolves to, in order, until one answers) and
    return the protocol, on a ``StampedTransport``. OSError when none answers."""
    loop = asyncio.get_running_loop()
    try:  # an address literal needs no resolver (the loop's runs in a thread)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    err: OSError = OSError(f"{host}:{port} resolves to no address")
    for family, type_, proto, _name, addr in infos:
        sock = socket.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, addr)
        except OSError as e:
            sock.close()
            err = e
            continue
        except BaseException:  # (cancelled: the connect timed out)
            sock.close()
            raise
        protocol = protocol_factory()
        StampedTransport(loop, sock, protocol)
        return protocol
    raise err
