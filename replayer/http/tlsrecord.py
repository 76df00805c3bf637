"""TLS on a hot-path connection, done by the connection itself over its plain TCP transport.

Why not asyncio's SSL transport: only it could then write, so a TLS request went out from the
event loop at its due time, behind whatever stream reads held the loop (tens of milliseconds of
dispatch error under W1 at 10x), and paid the transport's machinery per write. Here the handshake
and every read go through an ``ssl.SSLObject`` on memory BIOs (``TLSSession``), and once the
handshake is done a TLS 1.3 connection's client-to-server records are sealed by this module
(``RecordSealer``: RFC 8446 section 5.2 record protection with the ``cryptography`` AEADs) from
the client's traffic secret. A request is then sealed when it is handed to the launcher process
(``replayer.http.launcher``), which writes the records at the due time as it writes plain HTTP.

The traffic secret comes from OpenSSL's key log, read in the process and bound to the connection
by the client random of its ClientHello (``replayer.http.tlskeylog``: why by identity, and why
the reader cannot block OpenSSL's writer). Where no secret can be had (TLS 1.2, a cipher suite
not here, no key-log line for this connection), the ``SSLObject`` writes, from the event loop,
as asyncio's transport did (``TLSSession.unsealed`` says why).

Once sealed, a connection has one writer of records, the sealer, and its sequence numbers are
the only ones used under its key: the ``SSLObject``'s own records are never sent (sent, they
would reuse the sealer's nonces). The reads stay with the ``SSLObject``: server records, session
tickets (kept by the pool for resumption) and alerts. A server's KeyUpdate with
``update_requested`` leaves the ``SSLObject`` owing an answer (OpenSSL writes it at its next
write: ``wire`` makes an empty write to find out), which is dropped; the sealer answers instead
(RFC 8446 section 4.6.3: a KeyUpdate of its own, ``update_not_requested``, before its next
application data record, sealed under the current key, then the next traffic secret of section
7.2 and sequence numbers from 0). Answered rather than retired: a retired connection costs a new
handshake on a later request's time, when the replayer keeps its connections warm so that no
request pays one; the answer is one record and one HKDF step, checked against two TLS
implementations (tests/test_tls_matrix.py). The sealer updates its key the same way itself
after ``RECORDS_PER_KEY`` records, below the AES-GCM limit (RFC 8446 section 5.5). A closing
connection sends a sealed close_notify (``close_notify``).
"""

from __future__ import annotations

import ssl
import struct
from collections.abc import Callable

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

from replayer.http.tlskeylog import KeyLog

#: TLS 1.3 cipher suites: (key length, hash, AEAD)
_SUITES: dict[str, tuple[int, Callable[[], hashes.HashAlgorithm], Callable[[bytes], AESGCM | ChaCha20Poly1305]]] = {
    "TLS_AES_128_GCM_SHA256": (16, hashes.SHA256, AESGCM),
    "TLS_AES_256_GCM_SHA384": (32, hashes.SHA384, AESGCM),
    "TLS_CHACHA20_POLY1305_SHA256": (32, hashes.SHA256, ChaCha20Poly1305),
}
#: the most plaintext bytes in one record (RFC 8446 section 5.1)
MAX_RECORD = 1 << 14
#: records sealed under one key before the sealer updates it (AES-GCM: 2^24.5 at most)
RECORDS_PER_KEY = 1 << 24
_APPLICATION_DATA, _HANDSHAKE, _ALERT = 0x17, 0x16, 0x15
#: KeyUpdate (handshake type 24, length 1) with request_update = update_not_requested (0)
_KEY_UPDATE = b"\x18\x00\x00\x01\x00"
#: close_notify alert (level warning, description 0)
_CLOSE_NOTIFY = b"\x01\x00"
#: why a connection is not sealed: a protocol the sealer does not do (every connection to this
#: server will be alike), or no key-log line for this connection
UNSEALED_VERSION, UNSEALED_SUITE, UNSEALED_SECRET = "version", "suite", "secret"


def expand_label(secret: bytes, label: bytes, length: int, hash_type: Callable[[], hashes.HashAlgorithm]) -> bytes:
    """HKDF-Expand-Label (RFC 8446 section 7.1) with an empty context."""
    full = b"tls13 " + label
    info = struct.pack(">H", length) + bytes((len(full),)) + full + b"\x00"
    return HKDFExpand(hash_type(), length, info).derive(secret)


def client_random(hello: bytes) -> bytes | None:
    """The 32-byte random of the ClientHello at the start of ``hello`` (a handshake record:
    record header 5 bytes, handshake header 4, legacy_version 2, then the random), or None when
    ``hello`` does not start with one."""
    if len(hello) < 43 or hello[0] != _HANDSHAKE or hello[5] != 1:
        return None
    return bytes(hello[11:43])


class RecordSealer:
    """Client-to-server TLS 1.3 records under one connection's traffic secret, in sequence.
    ``update_due``: a KeyUpdate goes before the next record (the server asked for one); the
    sealer sets it itself after ``RECORDS_PER_KEY`` records. ``updates`` counts the key updates."""

    __slots__ = ("_aead", "_iv", "seq", "_secret", "_key_len", "_hash", "_make", "update_due", "updates")

    def __init__(self, suite: str, secret: bytes) -> None:
        self._key_len, self._hash, self._make = _SUITES[suite]
        self.update_due = False
        self.updates = 0
        self._use(secret)

    def _use(self, secret: bytes) -> None:
        """Key and IV from ``secret`` (RFC 8446 section 7.3), sequence numbers from 0."""
        self._secret = secret
        self._aead = self._make(expand_label(secret, b"key", self._key_len, self._hash))
        self._iv = int.from_bytes(expand_label(secret, b"iv", 12, self._hash), "big")
        self.seq = 0  # records sealed under this key so far (the next record's sequence number)

    def _record(self, content: bytes, content_type: int) -> bytes:
        """One record: ``content`` (at most ``MAX_RECORD`` bytes) sealed at the next sequence
        number. The sequence number never repeats under a key: it only grows, and the key is
        replaced (``_update``) before it reaches ``RECORDS_PER_KEY``."""
        inner = content + bytes((content_type,))
        header = b"\x17\x03\x03" + (len(inner) + 16).to_bytes(2, "big")
        sealed = self._aead.encrypt((self._iv ^ self.seq).to_bytes(12, "big"), inner, header)
        self.seq += 1
        return header + sealed

    def _update(self, out: list[bytes]) -> None:
        """Send a KeyUpdate under the current key, then switch to the next traffic secret
        (RFC 8446 sections 4.6.3 and 7.2)."""
        out.append(self._record(_KEY_UPDATE, _HANDSHAKE))
        self._use(expand_label(self._secret, b"traffic upd", self._hash().digest_size, self._hash))
        self.update_due = False
        self.updates += 1

    def seal(self, data: bytes) -> bytes:
        """``data`` as records (at most ``MAX_RECORD`` bytes of it each), in order; a KeyUpdate
        first when one is due."""
        out: list[bytes] = []
        view = memoryview(data)
        for i in range(0, len(data), MAX_RECORD):
            if self.update_due or self.seq >= RECORDS_PER_KEY - 1:
                self._update(out)
            out.append(self._record(bytes(view[i : i + MAX_RECORD]), _APPLICATION_DATA))
        return b"".join(out)

    def close_notify(self) -> bytes:
        """The close_notify alert, sealed (a KeyUpdate owed is not sent: no data follows)."""
        return self._record(_CLOSE_NOTIFY, _ALERT)


class TLSSession:
    """The TLS of one connection over memory BIOs: ``step`` the handshake with what ``feed``
    brought in, send what ``outgoing`` holds, then ``read`` the plaintext and ``wire`` (seal)
    what is to be written. ``sealer`` is None where the ``SSLObject`` writes (see the module
    docstring; ``unsealed`` says why)."""

    __slots__ = (
        "obj",
        "_in",
        "_out",
        "sealer",
        "handshaking",
        "_keylog",
        "random",
        "_hello",
        "_last",
        "unsealed",
        "peer_closed",
    )

    def __init__(
        self, ctx: ssl.SSLContext, server_name: str, session: ssl.SSLSession | None, keylog: KeyLog | None
    ) -> None:
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self._in, self._out, server_hostname=server_name, session=session)
        self.sealer: RecordSealer | None = None
        self.unsealed: str | None = None
        self.handshaking = True
        self._keylog = keylog
        self.random: bytes | None = None  # the ClientHello's client random: this connection's key-log lines
        self._hello = b""  # the ClientHello read from the BIO (to find the random), still to send
        self._last = b""  # the handshake's last flight (the client's Finished), still to send
        self.peer_closed = False  # the server's close_notify came

    def feed(self, data: bytes) -> None:
        self._in.write(data)

    def step(self) -> bool:
        """Advance the handshake with the bytes fed so far; True once it is done (then the
        sealer is set where it can be). Raises ``ssl.SSLError`` when it fails."""
        if not self.handshaking:
            return True
        try:
            self.obj.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        except ssl.SSLError:
            self.forget()
            raise
        if self.random is None:  # the first step wrote the ClientHello: note whose lines to keep
            self._hello = self._out.read()
            self.random = client_random(self._hello)
            if self.random is not None and self._keylog is not None:
                self._keylog.expect(self.random)
        if done:
            self.handshaking = False
            self._last = self._out.read()
            self._seal()
        return done

    def _seal(self) -> None:
        """The handshake is done: a sealer from this connection's own secret, where it can be."""
        secret = None
        if self.random is not None and self._keylog is not None:
            secret = self._keylog.secret(self.random)
        suite = self.obj.cipher()
        if self.obj.version() != "TLSv1.3":
            self.unsealed = UNSEALED_VERSION
        elif suite is None or suite[0] not in _SUITES:
            self.unsealed = UNSEALED_SUITE
        elif secret is None:
            self.unsealed = UNSEALED_SECRET
        else:
            self.sealer = RecordSealer(suite[0], secret)

    def forget(self) -> None:
        """The handshake will not complete: its key-log line is not wanted any more."""
        if self.handshaking and self.random is not None and self._keylog is not None:
            self._keylog.forget(self.random)

    def outgoing(self) -> bytes:
        """What the ``SSLObject`` has to send: the handshake's records (its last flight, kept by
        ``step``, included), and with no sealer its other records too. After the switch to the
        sealer its own records are dropped (see the module docstring)."""
        data = self._out.read()
        if self._hello or self._last:
            data, self._hello, self._last = self._hello + self._last + data, b"", b""
            return data
        if self.sealer is not None and not self.handshaking:
            return b""
        return data

    def read(self) -> bytes:
        """The plaintext of every whole record fed so far (b"" when none); ``peer_closed`` once
        the server's close_notify came (Python's ``ssl`` reads it as b"" or raises
        ``ssl.SSLZeroReturnError``). Raises ``ssl.SSLError`` on an alert or a bad record. Sealed, a record the ``SSLObject`` wrote
        while reading (an OpenSSL that answers a KeyUpdate at once: the only record it writes
        after the handshake here) is dropped and the sealer answers instead."""
        obj, pending_in = self.obj, self._in
        first = b""
        rest: list[bytes] | None = None
        try:
            while True:
                try:
                    chunk = obj.read(16384)
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:
                    self.peer_closed = True
                    break
                if not chunk:  # (only the close_notify reads as nothing: else SSLWantReadError)
                    self.peer_closed = True
                    break
                if not first:
                    first = chunk
                elif rest is None:
                    rest = [first, chunk]
                else:
                    rest.append(chunk)
                if not pending_in.pending and not obj.pending():
                    break  # every byte fed was a whole record: no SSLWantReadError to raise
        finally:
            sealer = self.sealer
            if sealer is not None and self._out.pending:
                self._out.read()
                sealer.update_due = True
        return first if rest is None else b"".join(rest)

    def wire(self, data: bytes) -> bytes:
        """``data`` as the records to write. Sealed, the ``SSLObject`` is asked first whether it
        owes the server a KeyUpdate (OpenSSL answers a KeyUpdate with ``update_requested`` at its
        next write, not when it reads it: an empty write makes it write the answer, which is
        dropped, and the sealer answers instead, before these records)."""
        sealer = self.sealer
        if sealer is not None:
            try:
                self.obj.write(b"")
            except ssl.SSLError:  # (a closed connection: its exchange fails through the reads)
                pass
            if self._out.pending:
                self._out.read()
                sealer.update_due = True
            return sealer.seal(data)
        self.obj.write(data)
        return self._out.read()

    def close_notify(self) -> bytes:
        """The records that tell the server this client closes (its close_notify alert)."""
        if self.sealer is not None:
            return self.sealer.close_notify()
        try:
            self.obj.unwrap()
        except ssl.SSLError:  # (SSLWantReadError: the server's close_notify is not awaited)
            pass
        return self._out.read()
