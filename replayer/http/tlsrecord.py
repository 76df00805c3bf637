"""TLS on a hot-path connection, done by the connection itself over its plain TCP transport.

Why not asyncio's SSL transport: only it could then write, so a TLS request went out from the
event loop at its due time, behind whatever stream reads held the loop (tens of milliseconds of
dispatch error under W1 at 10x), and paid the transport's machinery per write. Here the handshake
and every read go through an ``ssl.SSLObject`` on memory BIOs (``TLSSession``), and once the
handshake is done a TLS 1.3 connection's client-to-server records are sealed by this module
(``RecordSealer``: RFC 8446 section 5.2 record protection with the ``cryptography`` AEADs) from
the client's traffic secret. A request is then sealed when it is handed to the launcher process
(``replayer.http.launcher``), which writes the records at the due time as it writes plain HTTP.

The traffic secret comes from OpenSSL's key log (``SSLContext.keylog_filename``), pointed at a
pipe this process reads (``KeyLog``): the secrets never touch a disk. A handshake writes its lines
while ``do_handshake`` runs on the loop thread, and the log is read after every call, so the
client traffic secret read after the call that completed a handshake is that connection's.
Where no secret can be had (TLS 1.2, a cipher suite not here, a log line missing), the
``SSLObject`` writes too, from the event loop, as asyncio's transport did.

The reads stay with the ``SSLObject``: server records, session tickets (kept by the pool for
resumption: ``ssl.SSLSession``) and alerts. After the switch the ``SSLObject``'s own records
(a KeyUpdate answer, a closing alert) are dropped: sent, they would reuse the sealer's nonces.
A server that asks for a KeyUpdate keeps reading this client's records under the old key (the
key is the client's to update), so nothing breaks; a connection is closed after
``RECORDS_PER_KEY`` records, below the AES-GCM limit on records per key (RFC 8446 section 5.5).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import ssl
import struct
from collections.abc import Callable

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

#: TLS 1.3 cipher suites: (key length, hash, AEAD)
_SUITES: dict[str, tuple[int, Callable[[], hashes.HashAlgorithm], Callable[[bytes], AESGCM | ChaCha20Poly1305]]] = {
    "TLS_AES_128_GCM_SHA256": (16, hashes.SHA256, AESGCM),
    "TLS_AES_256_GCM_SHA384": (32, hashes.SHA384, AESGCM),
    "TLS_CHACHA20_POLY1305_SHA256": (32, hashes.SHA256, ChaCha20Poly1305),
}
#: the most plaintext bytes in one record (RFC 8446 section 5.1)
MAX_RECORD = 1 << 14
#: records sealed with one key before the connection is retired (AES-GCM: 2^24.5 at most)
RECORDS_PER_KEY = 1 << 24
_APPLICATION_DATA = b"\x17"
_PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def expand_label(secret: bytes, label: bytes, length: int, hash_type: Callable[[], hashes.HashAlgorithm]) -> bytes:
    """HKDF-Expand-Label (RFC 8446 section 7.1) with an empty context."""
    full = b"tls13 " + label
    info = struct.pack(">H", length) + bytes((len(full),)) + full + b"\x00"
    return HKDFExpand(hash_type(), length, info).derive(secret)


class RecordSealer:
    """Client-to-server TLS 1.3 records of application data under one traffic secret."""

    __slots__ = ("_aead", "_iv", "seq")

    def __init__(self, suite: str, secret: bytes) -> None:
        key_len, hash_type, aead = _SUITES[suite]
        self._aead = aead(expand_label(secret, b"key", key_len, hash_type))
        self._iv = int.from_bytes(expand_label(secret, b"iv", 12, hash_type), "big")
        self.seq = 0  # records sealed so far (the next record's sequence number)

    def seal(self, data: bytes) -> bytes:
        """``data`` as records (at most ``MAX_RECORD`` bytes of it each), in order."""
        out = []
        encrypt, iv = self._aead.encrypt, self._iv
        view = memoryview(data)
        for i in range(0, len(data), MAX_RECORD):
            inner = bytes(view[i : i + MAX_RECORD]) + _APPLICATION_DATA
            header = b"\x17\x03\x03" + (len(inner) + 16).to_bytes(2, "big")
            out.append(header)
            out.append(encrypt((iv ^ self.seq).to_bytes(12, "big"), inner, header))
            self.seq += 1
        return b"".join(out)


class KeyLog:
    """OpenSSL's key log of ``ctx`` into a pipe this process reads (``take``). A key log the
    context already had (``SSLKEYLOGFILE``, for a packet capture) still gets every line."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self._tee = ctx.keylog_filename
        self._ctx = ctx
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

    def take(self) -> list[str]:
        """The lines written since the last call."""
        if self._r < 0:
            return []
        chunks = []
        while True:
            try:
                chunk = os.read(self._r, _PIPE_BYTES)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        if not chunks:
            return []
        text = b"".join(chunks).decode("ascii", "replace")
        if self._tee:
            with contextlib.suppress(OSError), open(self._tee, "a") as f:
                f.write(text)
        return text.splitlines()

    def close(self) -> None:
        """Stop logging (OpenSSL closes its end of the pipe) and close this end."""
        if self._r >= 0:
            with contextlib.suppress(Exception):
                self._ctx.keylog_filename = None  # type: ignore[assignment]
            os.close(self._r)
            self._r = -1


class TLSSession:
    """The TLS of one connection over memory BIOs: ``step`` the handshake with what ``feed``
    brought in, send what ``outgoing`` holds, then ``read`` the plaintext and ``wire`` (seal)
    what is to be written. ``sealer`` is None where the ``SSLObject`` writes (see the module
    docstring)."""

    __slots__ = ("obj", "_in", "_out", "sealer", "handshaking", "_keylog", "_secret", "_last")

    def __init__(
        self, ctx: ssl.SSLContext, server_name: str, session: ssl.SSLSession | None, keylog: KeyLog | None
    ) -> None:
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self._in, self._out, server_hostname=server_name, session=session)
        self.sealer: RecordSealer | None = None
        self.handshaking = True
        self._keylog = keylog
        self._secret: bytes | None = None
        self._last = b""  # the handshake's last flight (the client's Finished), still to send

    def feed(self, data: bytes) -> None:
        self._in.write(data)

    def step(self) -> bool:
        """Advance the handshake with the bytes fed so far; True once it is done (then the
        sealer is set where it can be). Raises ``ssl.SSLError`` when it fails."""
        try:
            self.obj.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        finally:
            self._note_secret()
        if done:
            self.handshaking = False
            self._last = self._out.read()
            suite = self.obj.cipher()
            if (
                self._secret is not None
                and suite is not None
                and suite[0] in _SUITES
                and self.obj.version() == "TLSv1.3"
            ):
                self.sealer = RecordSealer(suite[0], self._secret)
            self._secret = None
        return done

    def _note_secret(self) -> None:
        """Keep the client traffic secret this handshake step wrote to the key log, if any."""
        if self._keylog is None:
            return
        for line in self._keylog.take():
            if line.startswith("CLIENT_TRAFFIC_SECRET_0 "):
                parts = line.split()
                if len(parts) == 3:
                    self._secret = bytes.fromhex(parts[2])

    def outgoing(self) -> bytes:
        """What the ``SSLObject`` has to send: the handshake's records (its last flight, kept by
        ``step``, included), and with no sealer its other records too. After the switch to the
        sealer its own records are dropped (see the module docstring; the connection does not
        ask then)."""
        data = self._out.read()
        if self._last:
            data, self._last = self._last + data, b""
            return data
        if self.sealer is not None and not self.handshaking:
            return b""
        return data

    def read(self) -> bytes:
        """The plaintext of every whole record fed so far (b"" when none). Raises
        ``ssl.SSLZeroReturnError`` on the server's close_notify with nothing before it, and
        ``ssl.SSLError`` on an alert or a bad record."""
        obj, pending_in = self.obj, self._in
        first = b""
        rest: list[bytes] | None = None
        while True:
            try:
                chunk = obj.read(16384)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                if first:
                    break
                raise
            if not chunk:
                break
            if not first:
                first = chunk
            elif rest is None:
                rest = [first, chunk]
            else:
                rest.append(chunk)
            if not pending_in.pending and not obj.pending():
                break  # every byte fed was a whole record: no SSLWantReadError to raise
        return first if rest is None else b"".join(rest)

    def wire(self, data: bytes) -> bytes:
        """``data`` as the records to write."""
        sealer = self.sealer
        if sealer is not None:
            return sealer.seal(data)
        self.obj.write(data)
        return self._out.read()

    @property
    def worn(self) -> bool:
        """The sealer's key has sealed ``RECORDS_PER_KEY`` records: retire the connection."""
        return self.sealer is not None and self.sealer.seq >= RECORDS_PER_KEY
