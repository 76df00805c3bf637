"""The capture proxy's own parts, in process: arrival stamps taken by the kernel (not when a busy
loop gets to the read) on both sides, the client connection's parsing, pipelining and
backpressure, the poller's batching, the forward-delay buckets. The proxy as a whole runs in
tests/test_capture.py."""

from __future__ import annotations

import asyncio
import socket
import time

from replayer.capture.downstream import HEAD_READ, ClientConnection
from replayer.capture.headers import forward_headers, response_head
from replayer.capture.stamps import SO_TIMESTAMPNS, kernel_stamp_ns


def _pair() -> tuple[socket.socket, socket.socket]:
    """A loopback TCP connection; the accepted end stamps arrivals (as the proxy's listener sets it)."""
    with socket.socket() as lsock:
        lsock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        lsock.bind(("127.0.0.1", 0))
        lsock.listen()
        c = socket.create_connection(lsock.getsockname())
        s, _ = lsock.accept()
    return c, s


def test_the_arrival_stamp_is_the_kernels_not_the_reads():
    c, s = _pair()
    with c, s:
        for _ in range(100):  # the kernel turns stamping on a moment after the first socket asks
            c.sendall(b"x")
            if kernel_stamp_ns(s.recvmsg(16, 64)[1]) is not None:
                break
            time.sleep(0.01)
        sent = time.perf_counter_ns()
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        time.sleep(0.2)  # the reader is late (a busy loop)
        data, anc, _, _ = s.recvmsg(HEAD_READ, 64)
        read = time.perf_counter_ns()
        t = kernel_stamp_ns(anc)
    assert data.startswith(b"POST") and t is not None
    assert sent <= t + 1_000_000 and t < sent + 100_000_000 <= read  # at the send, not at the read


def test_headers_forwarded_without_hop_by_hop_ones_and_those_connection_names():
    h = [
        ("Connection", "keep-alive, X-Hop"),
        ("X-Hop", "1"),
        ("Keep-Alive", "5"),
        ("Host", "a"),
        ("Content-Length", "3"),
        ("Authorization", "Bearer k"),
        ("X-Custom", "kept"),
        ("Transfer-Encoding", "chunked"),
    ]
    assert forward_headers(h, frozenset(("host", "content-length"))) == [
        ("Authorization", "Bearer k"),
        ("X-Custom", "kept"),
    ]
    head = response_head(200, b"OK", [("X-A", "1")], "Transfer-Encoding: chunked", True, False)
    assert head == b"HTTP/1.1 200 OK\r\nX-A: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert b"Connection: close\r\n" in response_head(502, b"Bad Gateway", [], "Content-Length: 0", False, False)


def test_pipelined_requests_are_answered_in_order_one_at_a_time():
    async def main():
        c, s = _pair()
        s.setblocking(False)
        got = []

        def handler(conn, req):
            got.append((req.method, req.url, b"".join(req.body), req.header("x-n")))
            if len(got) == 1:  # the first is answered later: the second waits its turn
                asyncio.get_running_loop().call_later(0.05, lambda: (conn.write(b"A"), conn.done(True)))
            else:
                conn.write(b"B")
                conn.done(False)

        closed = []
        ClientConnection(asyncio.get_running_loop(), s, handler, closed.append)
        c.sendall(b"POST /a HTTP/1.1\r\nX-N: 1\r\nContent-Length: 2\r\n\r\nhiGET /b?q HTTP/1.1\r\nX-N: 2\r\n\r\n")
        c.setblocking(False)
        out = b""
        for _ in range(200):
            await asyncio.sleep(0.01)
            try:
                d = c.recv(100)
            except BlockingIOError:
                continue
            if not d:
                break
            out += d
        c.close()
        return got, out, closed

    got, out, closed = asyncio.run(main())
    assert got == [("POST", b"/a", b"hi", "1"), ("GET", b"/b?q", b"", "2")]
    assert out == b"AB" and len(closed) == 1  # in order; closed after the second (keep_alive False)


def test_each_request_has_its_first_and_last_bytes_arrival_also_when_the_next_begins_in_the_same_read():
    async def main():
        c, s = _pair()
        s.setblocking(False)
        got = []

        def handler(conn, req):
            got.append(req)
            conn.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            conn.done(True)

        ClientConnection(asyncio.get_running_loop(), s, handler, lambda conn: None)
        c.sendall(b"POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\n")  # A's head
        await asyncio.sleep(0.1)  # (read: A has begun)
        second = time.perf_counter_ns()
        c.sendall(b"hiPOST /b HTTP/1.1\r\nContent-Length: 0\r\n\r\n")  # A's body and B, one segment
        for _ in range(200):
            await asyncio.sleep(0.01)
            if len(got) == 2:
                break
        c.close()
        return got, second

    (a, b), second = asyncio.run(main())
    slack = 1_000_000  # (the clocks' offset is sampled to ~20 us)
    assert a.arrival_ns < second <= a.complete_ns + slack  # A: first byte before, last byte after
    assert b.arrival_ns + slack >= second  # B came with A's last bytes, not with A's first


def test_the_poller_takes_turns_only_while_busy_and_then_lets_the_loop_block():
    from replayer.capture.poll import Poller

    async def main():
        busy = [True]
        p = Poller(0.002, lambda: busy[0])
        p.kick()
        p.kick()  # (once running, a kick changes nothing)
        await asyncio.sleep(0.1)
        during = p.turns
        busy[0] = False
        await asyncio.sleep(0.05)
        after = p.turns
        await asyncio.sleep(0.1)
        return during, after, p.turns, p.running

    during, after, end, running = asyncio.run(main())
    assert during >= 5  # it slept between turns (0.1 s / 2 ms at most 50 turns)
    assert after == end and not running  # not busy: no more turns


def test_a_request_socket_ends_the_pollers_wait_at_once():
    from replayer.capture.poll import Poller

    async def main():
        a, b = socket.socketpair()
        with a, b:
            a.send(b"x")  # b is readable: a request waits there
            p = Poller(5.0, lambda: True, {b.fileno()})
            p.kick()
            deadline = time.monotonic() + 4.0  # under one interval
            while p.turns < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            p.busy = lambda: False
            return p.turns

    assert asyncio.run(main()) >= 3  # had it waited out the 5 s interval, one turn


def test_a_slow_client_pauses_its_producer_and_gets_every_byte():
    from replayer.capture.downstream import WRITE_HIGH

    async def main():
        c, s = _pair()
        s.setblocking(False)
        c.setblocking(False)
        events = []
        conn = ClientConnection(asyncio.get_running_loop(), s, lambda *_: None, lambda _c: None)
        conn.on_pause, conn.on_resume = (lambda: events.append("pause")), (lambda: events.append("resume"))
        piece = bytes(range(256)) * 256  # 64 KiB
        n = 0
        while "pause" not in events and n < 64 * WRITE_HIGH:  # the client reads nothing yet
            conn.write(piece)
            n += len(piece)
        got = bytearray()
        while len(got) < n:  # now it reads everything
            try:
                got += c.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.005)
        conn.close()
        c.close()
        return events, n, bytes(got), piece

    events, n, got, piece = asyncio.run(main())
    assert events == ["pause", "resume"]
    assert got == piece * (n // len(piece))  # in order, nothing lost or repeated


class _Recorder(asyncio.Protocol):
    """Keeps what a ``StampedTransport`` gives it: each read with its stamp, and the losses."""

    def __init__(self) -> None:
        self.transport = None
        self.reads: list[tuple[bytes, int]] = []
        self.lost: list[object] = []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.reads.append((data, self.transport.stamp_ns))

    def connection_lost(self, exc) -> None:
        self.lost.append(exc)


def test_an_upstream_connection_stamps_each_read_with_the_kernels_arrival_and_writes_every_byte():
    from replayer.capture.stamps import open_stamped

    async def main():
        with socket.socket() as lsock:
            lsock.bind(("127.0.0.1", 0))
            lsock.listen()
            proto = await open_stamped("127.0.0.1", lsock.getsockname()[1], _Recorder)
            srv, _ = lsock.accept()
        with srv:
            for _ in range(100):  # the kernel turns stamping on a moment after the socket asks
                srv.sendall(b"x")
                await asyncio.sleep(0.01)
                if proto.reads and proto.transport.unstamped == 0:
                    break
                proto.reads.clear()
                proto.transport.unstamped = 0
            proto.reads.clear()
            sent = time.perf_counter_ns()
            srv.sendall(b"event")
            time.sleep(0.2)  # the loop is busy: the read comes late
            read_after = time.perf_counter_ns()
            for _ in range(100):
                await asyncio.sleep(0.01)
                if proto.reads:
                    break
            ((data, stamp),) = proto.reads
            assert data == b"event"
            assert sent <= stamp + 1_000_000 and stamp < sent + 100_000_000 <= read_after  # at the send

            big = bytes(range(256)) * 40_000  # 10 MB: more than the socket takes at once
            proto.transport.write(big)
            got = bytearray()
            srv.setblocking(False)
            for _ in range(2000):
                await asyncio.sleep(0)  # (the transport writes the rest when the socket is writable)
                try:
                    got += srv.recv(1 << 20)
                except BlockingIOError:
                    await asyncio.sleep(0.001)
                if len(got) == len(big):
                    break
            assert bytes(got) == big

            proto.transport.pause_reading()
            srv.sendall(b"later")
            await asyncio.sleep(0.05)
            assert proto.reads[-1][0] == b"event" and not proto.transport.is_reading()
            proto.transport.resume_reading()
            for _ in range(100):
                await asyncio.sleep(0.01)
                if proto.reads[-1][0] == b"later":
                    break
            assert proto.reads[-1][0] == b"later"
            srv.shutdown(socket.SHUT_WR)  # the upstream closes: connection_lost(None), once
            for _ in range(100):
                await asyncio.sleep(0.01)
                if proto.lost:
                    break
            assert proto.lost == [None] and proto.transport.is_closing()
            proto.transport.close()
            await asyncio.sleep(0.01)
            assert proto.lost == [None]

        with socket.socket() as free:  # nobody listens: the connect fails with OSError
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        try:
            await open_stamped("127.0.0.1", port, _Recorder)
        except OSError:
            pass
        else:
            raise AssertionError("connected to a port nobody listens on")

    asyncio.run(main())


def test_forward_delays_are_counted_in_prometheus_buckets():
    from replayer.capture.metrics import FORWARD_DELAY_BUCKETS, ForwardDelay

    fd = ForwardDelay()
    obs = fd.observer("response")
    for ns in (-3_000, 0, 100_000, 100_001, 999_999, 1_000_000, 1_000_001, 5_000_000_000):
        obs(ns)
    b = dict(fd.buckets("response"))
    assert b[0.0001] == 3  # <= 100 us: the negative (clock offset) one as zero, 0, 100 us exactly
    assert b[0.00025] == 4 and b[0.001] == 6 and b[0.0025] == 7
    assert b[FORWARD_DELAY_BUCKETS[-1]] == 7 and b[float("inf")] == 8
    assert dict(fd.buckets("request"))[float("inf")] == 0
    (fam,) = list(fd.collect())
    s = {(x.name, x.labels["direction"], x.labels.get("le")): x.value for x in fam.samples}
    assert s[("replayer_capture_forward_delay_seconds_count", "response", None)] == 8
    assert abs(s[("replayer_capture_forward_delay_seconds_sum", "response", None)] - 5.003200001) < 1e-9
