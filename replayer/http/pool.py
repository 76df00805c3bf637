"""The hot-path client's keep-alive connection pool (``replayer.http.client.Client`` is one).

Unlimited connections (no hidden client-side queue, case B24): a request takes the most recently
used idle connection (LIFO: the warm ones first) or opens its own. Spares are opened in the
background, ahead of demand: up to ``spare_target`` idle ones, and as many as the requests due
soon (``expect``), so a request due later finds one ready instead of paying for a TCP handshake
at its due time; a failed background connect pauses them for ``SPARE_BACKOFF_NS`` (a target
that is down gets each request's own connect attempt, not a storm of spares). Idle connections
beyond the spares expire after ``IDLE_EXPIRY_S`` unused, and those the server closed leave the pool.

TLS is the connections' own (``Connection.start_tls``, ``replayer.http.tlsrecord``): the pool
keeps the newest session ticket a server gave and offers it to each new connection, so a server
that allows resumption skips the certificate exchange and its signatures on every connection
after the first (``tls_handshakes``, ``tls_resumed`` count them). ``sealing`` says whether the
launcher can write on this server's connections at all: not over TLS 1.2 or a cipher suite the
record sealer does not do (then the sender leaves every request to the loop at once, instead of
offering it again and again); a connection whose own key-log line was missing is the only one
unsealed (``tls_unmatched``). Idle connections are closed with a TLS close_notify.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque

from replayer.core.clock import now_ns
from replayer.core.errors import ErrorKind
from replayer.http.connection import Connection, Failure, Owner
from replayer.http.tls import describe_failure
from replayer.http.tlskeylog import KeyLog
from replayer.http.tlsrecord import UNSEALED_SECRET

SPARE_BACKOFF_NS = 500_000_000  # no connections opened ahead for this long after one failed
IDLE_EXPIRY_S = 60.0  # an idle keep-alive connection beyond the spares is closed after this long unused
TICKET_WAIT_S = 0.2  # the longest the warm-up waits for a TLS session ticket before opening the rest


class Pool:
    """Idle keep-alive connections to ``host:port`` (TLS with ``ssl_context``, ``server_name`` as
    SNI and certificate name), each opened (TCP and TLS handshake) within ``connect_timeout_s``; one beyond the ``spare_target`` spares is closed once unused for
    ``idle_expiry_s`` (a burst's connections are not kept for the rest of a soak). ``owner``: what
    each connection asks about itself (``connection.Owner``: its quick-ACK policy, and the call
    when it closes, for the client to drop its write queued in the launcher process); the pool
    itself when None (no delayed ACKs, nothing queued)."""

    delayed_ack = False

    def __init__(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        connect_timeout_s: float,
        *,
        owner: Owner | None = None,
        idle_expiry_s: float = IDLE_EXPIRY_S,
        server_name: str | None = None,
    ) -> None:
        self.host = host
        #: SNI and the name checked against the certificate (TLS; default: the host; Python sends no SNI for an IP address)
        self.server_name = server_name or host
        self._tls_messages: dict[str, str] = {}
        self.port = port
        self._ssl = ssl_context
        self.connect_timeout_s = connect_timeout_s
        self._owner: Owner = owner if owner is not None else self
        # the idle pool, a LIFO stack: the newest on the right, spares and the longest idle on the left
        self._idle: deque[Connection] = deque()
        self._idle_expiry_ns = int(idle_expiry_s * 1e9)
        self._all: set[Connection] = set()
        self._spares_opening = 0
        self._spares_paused_until = 0  # no background connects before this (one failed)
        self.spare_target = 8  # idle connections kept ready in the background (0 = none)
        #: the key log the connections' record sealers read their secrets from (TLS only)
        self._keylog = KeyLog(ssl_context) if ssl_context is not None else None
        self._session: ssl.SSLSession | None = None  # the newest resumable session (TLS)
        self.tls_handshakes = 0  # TLS handshakes completed
        self.tls_resumed = 0  # of which resumed a session
        self.tls_sealed = 0  # of which the replayer seals the records (the launcher can write: TLS 1.3)
        self.tls_versions: dict[str, int] = {}  # handshakes by protocol version
        self.tls_unmatched = 0  # TLS 1.3 handshakes with no key-log line of their own: never sealed
        #: the launcher can write on this server's connections (False: TLS 1.2, or a suite not sealed here)
        self.sealing = True
        self.tls_requests_sealed = 0  # TLS requests written by the launcher (records sealed here)
        self.tls_requests_loop = 0  # TLS requests written by the event loop
        self._key_updates_gone = 0  # key updates of the sealers of connections no longer in the pool

    @property
    def tls(self) -> bool:
        """The pool speaks TLS."""
        return self._ssl is not None

    def cancel_launch(self, conn: Connection) -> None:
        """``conn`` is closing: nothing queued elsewhere to drop (an owner of its own may have)."""

    @property
    def tls_key_updates(self) -> int:
        """KeyUpdates the record sealers sent (the server asked, or a key's records were used up)."""
        return self._key_updates_gone + sum(_updates(c) for c in self._all)

    def _drop(self, c: Connection) -> None:
        if c in self._all:
            self._key_updates_gone += _updates(c)
            self._all.discard(c)

    async def close(self) -> None:
        """Close every connection: idle ones with a TLS close_notify, in-flight exchanges
        fail as DISCONNECT."""
        for c in list(self._all):
            self._drop(c)
            c.close()
        self._all.clear()
        self._idle.clear()
        if self._keylog is not None:
            self._keylog.close()
            self._keylog = None

    @property
    def open_connections(self) -> int:
        return sum(1 for c in self._all if not c.closed)

    async def warm_up(self, n: int) -> int:
        """Open up to ``n`` idle keep-alive connections ahead of the replay (so the first burst
        does not pay for TCP handshakes at its due time). Returns how many opened. Over TLS the
        first one opens alone and waits (``TICKET_WAIT_S`` at most) for the server's session
        ticket, so that the others resume its session instead of each doing a full handshake."""
        first: list[Connection | BaseException] = []
        if self._ssl is not None and self._session is None and n > 1:
            first = list(await asyncio.gather(self._connect(), return_exceptions=True))
            n -= 1
            if isinstance(first[0], Connection):
                await self._await_ticket(first[0])
        conns = first + await asyncio.gather(*(self._connect() for _ in range(n)), return_exceptions=True)
        ok = [c for c in conns if isinstance(c, Connection)]
        t = now_ns()
        for c in ok:
            c.idle_since_ns = t
        self._idle.extend(ok)
        return len(ok)

    async def _await_ticket(self, conn: Connection) -> None:
        """Wait for ``conn``'s session ticket (TLS 1.3 servers send it after the handshake) and
        keep it for the connections opened next; none after ``TICKET_WAIT_S`` (a server without
        resumption) is no error."""
        deadline = now_ns() + int(TICKET_WAIT_S * 1e9)
        while now_ns() < deadline and not conn.closed and not self._note_session(conn):
            await asyncio.sleep(0.002)

    def _note_session(self, conn: Connection) -> bool:
        """Keep ``conn``'s TLS session for new connections when the server gave it a ticket."""
        session = conn.tls.obj.session if conn.tls is not None else None
        if session is not None and session.has_ticket:
            self._session = session
            return True
        return False

    async def _connect(self) -> Connection:
        """A new connection: TCP within ``connect_timeout_s`` (asyncio.TimeoutError, OSError),
        then with TLS the handshake within what is left of it (``Failure`` TLS_ERROR naming the
        cause and the server's certificate: ``replayer.http.tls``)."""
        loop = asyncio.get_running_loop()
        t = loop.time()
        transport, conn = await asyncio.wait_for(
            loop.create_connection(lambda: Connection(self._owner), self.host, self.port),
            self.connect_timeout_s,
        )
        if self._ssl is not None:
            await self._handshake(conn, transport, self.connect_timeout_s - (loop.time() - t))
        self._all.add(conn)
        return conn

    async def _handshake(self, conn: Connection, transport: asyncio.Transport, left_s: float) -> None:
        """TLS on ``conn``'s TCP connection (apart from the connect, so that a handshake timeout
        and a TLS failure are told apart from a TCP one), offering the newest session."""
        try:
            await asyncio.wait_for(
                conn.start_tls(self._ssl, self.server_name, self._session, self._keylog),  # type: ignore[arg-type]
                max(left_s, 0.001),
            )
        except asyncio.TimeoutError:
            transport.abort()
            raise Failure(
                ErrorKind.TLS_ERROR,
                f"TLS error with {self.host}:{self.port}: handshake timeout: the TCP connection opened but no "
                f"TLS handshake within {self.connect_timeout_s:g} s of the connect (--connect-timeout)",
            ) from None
        except ssl.SSLError as e:
            transport.abort()
            raise Failure(ErrorKind.TLS_ERROR, await self.tls_failure(e)) from None
        except BaseException:
            transport.abort()
            raise
        self.tls_handshakes += 1
        if conn.tls is not None:
            self.tls_resumed += conn.tls.obj.session_reused
            self.tls_sealed += conn.tls.sealer is not None
            unsealed = conn.tls.unsealed
            self.tls_unmatched += unsealed == UNSEALED_SECRET
            self.sealing = unsealed is None or unsealed == UNSEALED_SECRET
            version = conn.tls.obj.version() or "unknown"
            self.tls_versions[version] = self.tls_versions.get(version, 0) + 1

    async def tls_failure(self, e: ssl.SSLError) -> str:
        """The message of a TLS failure (``tls.describe_failure``), the server's certificate
        fetched once per pool and kind of failure (not once per failed connect)."""
        key = f"{type(e).__name__}:{getattr(e, 'verify_code', '')}:{e.reason}"
        text = self._tls_messages.get(key)
        if text is None:
            text = self._tls_messages[key] = await describe_failure(
                e, self.host, self.port, self.server_name, min(self.connect_timeout_s, 5.0)
            )
        return text

    def idle_connection(self) -> Connection | None:
        """An idle keep-alive connection ready for an exchange (topping the spares up), or None."""
        idle = self._idle
        if len(idle) + self._spares_opening < self.spare_target and now_ns() >= self._spares_paused_until:
            self._open_spare()
        while idle:
            c = idle.pop()
            if not c.closed and c.ex is None and c.keep_alive:
                return c
            self._drop(c)
            c.abort()
        return None

    def launchable_connection(self) -> Connection | None:
        """An idle connection the launcher may write on (``Connection.launchable``), the newest
        first, or None; one it may not write on yet stays idle for the loop."""
        idle = self._idle
        if len(idle) + self._spares_opening < self.spare_target and now_ns() >= self._spares_paused_until:
            self._open_spare()
        for i in range(len(idle) - 1, -1, -1):
            c = idle[i]
            if c.launchable:
                del idle[i]
                return c
            if c.closed or c.ex is not None or not c.keep_alive:  # (gone: out of the pool, not scanned again)
                del idle[i]
                self._drop(c)
                c.abort()
        return None

    async def acquire(self) -> Connection:
        """An idle connection, else a new one (raises what the connect raises)."""
        return self.idle_connection() or await self._connect()

    def _open_spare(self) -> None:
        """Open one connection in the background, so a request due later finds one ready instead
        of paying for a TCP handshake at its due time. A failure pauses background connects (the
        pool's top-up to ``spare_target`` and ``expect``) for ``SPARE_BACKOFF_NS``."""
        self._spares_opening += 1

        def done(t: asyncio.Task[Connection]) -> None:
            self._spares_opening -= 1
            if t.cancelled():
                return
            if t.exception() is None:
                c = t.result()
                c.idle_since_ns = now_ns()
                self._idle.appendleft(c)  # LIFO pool: spares are used after warm ones
            else:  # the target refuses or is down: no connect storm ahead of demand for a while
                self._spares_paused_until = now_ns() + SPARE_BACKOFF_NS

        asyncio.get_running_loop().create_task(self._connect()).add_done_callback(done)

    def expect(self, n: int) -> None:
        """Loop thread: ``n`` requests are due soon (the dispatcher counts them): open
        connections in the background until ``n`` are idle or opening (at most 32 more per
        call), so each finds one ready (and can go through the launcher) instead of waiting for
        a TCP handshake at its due time. Connections busy now are not counted: some may be
        free by then, so this errs on the side of a few idle connections more. After a failed
        background connect it opens none for ``SPARE_BACKOFF_NS`` (a target that is down gets
        each request's own connect attempt, not a storm of spares)."""
        if now_ns() < self._spares_paused_until:
            return
        for _ in range(min(n - len(self._idle) - self._spares_opening, 32)):
            self._open_spare()

    def give_back(self, c: Connection) -> None:
        """Back to the idle pool, unused (its exchange never started)."""
        c.idle_since_ns = now_ns()
        self._idle.append(c)

    def release(self, c: Connection) -> None:
        """An exchange on ``c`` ended: kept alive and idle, or closed. A TLS connection's first
        exchange brings the server's session tickets (TLS 1.3 sends them after the handshake):
        its session becomes the one offered to new connections. One the server will not keep
        alive is closed (a TLS close_notify first)."""
        if c.served == 1 and c.tls is not None:
            self._note_session(c)
        if c.closed or not c.keep_alive or c.ex is not None:
            self._drop(c)
            c.close()
        else:
            c.idle_since_ns = now = now_ns()
            idle = self._idle
            idle.append(c)
            if len(idle) > self.spare_target:
                self._expire_idle(now)

    def _expire_idle(self, now: int) -> None:
        """Close the idle connections unused for ``idle_expiry_s``, and drop those the server
        closed, from the long-idle end of the pool while it holds more than ``spare_target``
        (amortized O(1): each connection leaves once)."""
        idle, limit = self._idle, now - self._idle_expiry_ns
        while len(idle) > self.spare_target:
            c = idle[0]
            if not c.closed and c.ex is None and c.idle_since_ns > limit:
                return
            idle.popleft()
            if not c.closed and c.ex is None:  # (one with an exchange is not idle: only dropped)
                c.close()
            self._drop(c)


def _updates(c: Connection) -> int:
    sealer = c.tls.sealer if c.tls is not None else None
    return sealer.updates if sealer is not None else 0
