"""Real TLS servers of other implementations for the record sealer's matrix
(tests/test_tls_matrix.py), each answering the replayer's POSTs with one short SSE completion:

* ``OpenSSLServer``: Debian's ``openssl s_server`` (its C state machine, not Python's wrapper),
  one connection at a time; the test writes the answers (and ``s_server``'s commands: ``K``/``k``
  for a KeyUpdate with or without ``update_requested``) to its standard input and reads what it
  decrypted from its standard output; ``-msg`` traces every TLS message it got (``trace``).
* ``TlsliteServer``: tlslite-ng (PyPI), a TLS stack written in Python from the RFCs, sharing no
  code with OpenSSL; scripted per connection (``after``: a KeyUpdate, a close_notify without a
  TCP close) and telling whether the client's traffic secret moved (the client's KeyUpdate).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
import time

SSE = (
    b'data: {"choices":[{"index":0,"text":"hi","finish_reason":"length"}],'
    b'"usage":{"prompt_tokens":16,"completion_tokens":1,"total_tokens":17}}\n\ndata: [DONE]\n\n'
)
#: the answer to every request: one short SSE completion (well under one pipe write: s_server
#: reads its standard input in one piece, and a piece starting with a command letter is a command)
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(SSE), SSE)

#: cipher suite -> (s_server options, tlslite-ng cipher name, TLS version)
SUITES = {
    "TLS_AES_128_GCM_SHA256": (["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"], "aes128gcm", (3, 4)),
    "TLS_AES_256_GCM_SHA384": (["-tls1_3", "-ciphersuites", "TLS_AES_256_GCM_SHA384"], "aes256gcm", (3, 4)),
    "TLS_CHACHA20_POLY1305_SHA256": (["-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"], "chacha20-poly1305", (3, 4)),
    "TLS1.2": (["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256"], "aes128gcm", (3, 3)),
}  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen | None = None, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def _requests(buf: bytes, start: int) -> tuple[int, int]:
    """(whole POST requests in ``buf`` from ``start``, where the next one would start)."""
    n = 0
    while True:
        i = buf.find(b"POST /", start)
        if i < 0:
            return n, start
        end = buf.find(b"\r\n\r\n", i)
        if end < 0:
            return n, i
        m = re.search(rb"(?i)content-length: *(\d+)", buf[i:end])
        stop = end + 4 + (int(m.group(1)) if m else 0)
        if len(buf) < stop:
            return n, i
        n, start = n + 1, stop


class OpenSSLServer:
    """``openssl s_server`` on a free port with ``cert``/``key`` and ``options``; answers each
    request it decrypts with ``RESPONSE``. ``command(b"K")`` sends one of its commands."""

    def __init__(self, cert: str, key: str, options: list[str], workdir: str) -> None:
        self.port = free_port()
        self.msgfile = os.path.join(workdir, f"s_server_{self.port}.msg")
        self.served = 0
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            ["openssl", "s_server", "-accept", f"127.0.0.1:{self.port}", "-cert", cert, "-key", key,
             "-msg", "-msgfile", self.msgfile, *options],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.output = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        _wait_listening(self.port, self.proc)

    @staticmethod
    def available() -> bool:
        return shutil.which("openssl") is not None

    def _read(self) -> None:
        start = 0
        while True:
            chunk = self.proc.stdout.read1(65536)  # type: ignore[union-attr]
            if not chunk:
                return
            with self._lock:
                self.output += chunk
                n, start = _requests(self.output, start)
                for _ in range(n):
                    self._write(RESPONSE)
                    self.served += 1

    def _write(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, ValueError):
            pass

    def command(self, letter: bytes) -> None:
        """One of s_server's commands (``K``: KeyUpdate, update_requested; ``k``: without)."""
        with self._lock:
            self._write(letter + b"\n")
        time.sleep(0.2)  # (s_server acts on its next turn: the record is out before the next request)

    def trace(self) -> str:
        """The TLS messages s_server sent (``>>>``) and got (``<<<``) so far."""
        try:
            with open(self.msgfile, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def got_key_updates(self) -> int:
        return len(re.findall(r"<<< TLS 1\.3, Handshake \[length 0005\], KeyUpdate", self.trace()))

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(5)


class TlsliteServer:
    """A tlslite-ng server on a free port (``cipher``: its cipher name, ``version``: the highest
    TLS version), one thread per connection, answering each request with ``RESPONSE``; after
    the n-th response on a connection it does ``after[n]``: ``"key_update"`` /
    ``"key_update_requested"`` (a KeyUpdate) or ``"close_notify"`` (a close_notify alert, the
    TCP connection left open). ``client_updates`` counts the client traffic secrets that moved
    between two requests (the client's KeyUpdates); ``resumed`` the resumed handshakes."""

    def __init__(
        self, cert: str, key: str, cipher: str, version: tuple[int, int], after: dict[int, str] | None = None
    ) -> None:
        from tlslite import HandshakeSettings, SessionCache, X509CertChain, parsePEMKey

        with open(cert) as f:
            self._chain = X509CertChain()
            self._chain.parsePemList(f.read())
        with open(key) as f:
            self._key = parsePEMKey(f.read(), private=True)
        self._settings = HandshakeSettings()
        self._settings.cipherNames = [cipher]
        self._settings.maxVersion = version
        self._settings.ticketKeys = [bytearray(os.urandom(32))]
        self._cache = SessionCache()
        self.after = after or {}
        self.served = self.client_updates = self.resumed = self.handshakes = 0
        self.errors: list[str] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @staticmethod
    def available() -> bool:
        try:
            import tlslite  # noqa: F401
        except ImportError:
            return False
        return True

    def _accept(self) -> None:
        while True:
            try:
                s, _ = self._sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(s,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, s: socket.socket) -> None:
        from tlslite import TLSConnection

        conn = TLSConnection(s)
        try:
            conn.handshakeServer(
                certChain=self._chain, privateKey=self._key, settings=self._settings, sessionCache=self._cache
            )
            self.handshakes += 1
            self.resumed += bool(conn.resumed)
            buf, n = b"", 0
            while True:
                secret = conn.session.cl_app_secret if conn.version == (3, 4) else None
                while _requests(buf, 0)[0] == 0:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                _, end = _requests(buf, 0)
                buf = buf[end:]
                if secret is not None and conn.session.cl_app_secret != secret:
                    self.client_updates += 1
                conn.sendall(RESPONSE)
                n += 1
                self.served += 1
                self._act(conn, self.after.get(n))
        except Exception as e:  # noqa: BLE001 - told to the test through ``errors``
            self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            s.close()

    def _act(self, conn, action: str | None) -> None:
        from tlslite.constants import AlertDescription, AlertLevel, KeyUpdateMessageType
        from tlslite.messages import Alert

        if action in ("key_update", "key_update_requested"):
            kind = (
                KeyUpdateMessageType.update_requested
                if action.endswith("requested")
                else KeyUpdateMessageType.update_not_requested
            )
            for _ in conn.send_keyupdate_request(kind):
                pass
        elif action == "close_notify":
            for _ in conn._sendMsg(Alert().create(AlertDescription.close_notify, AlertLevel.warning)):
                pass
            time.sleep(1.5)  # (the TCP connection stays open a while: no FIN behind the close_notify)
            raise ConnectionAbortedError("closed after close_notify")

    def close(self) -> None:
        self._sock.close()


class NginxTerminator:
    """Debian's nginx as a TLS terminator in front of ``upstream_port`` (plain HTTP, keep-alive
    upstream, no buffering: SSE passes through), for one cipher suite of ``SUITES``."""

    def __init__(self, cert: str, key: str, suite: str, upstream_port: int, workdir: str) -> None:
        self.port = free_port()
        os.makedirs(workdir, exist_ok=True)
        if suite == "TLS1.2":
            tls = "ssl_protocols TLSv1.2; ssl_ciphers ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256;"
        else:
            tls = f"ssl_protocols TLSv1.3; ssl_conf_command Ciphersuites {suite};"
        temp = " ".join(f"{k}_temp_path {workdir}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        conf = os.path.join(workdir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(
                ("user root;\n" if os.geteuid() == 0 else "")
                + f"daemon off; worker_processes 1; pid {workdir}/nginx.pid; error_log {workdir}/error.log;\n"
                "events { worker_connections 512; }\n"
                f"http {{ access_log off; {temp}\n"
                f"  upstream up {{ server 127.0.0.1:{upstream_port}; keepalive 64; }}\n"
                f"  server {{ listen 127.0.0.1:{self.port} ssl; ssl_certificate {cert}; ssl_certificate_key {key}; {tls}\n"
                '    location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection "";\n'
                "      proxy_buffering off; proxy_request_buffering off; } } }\n"
            )
        self.proc = subprocess.Popen(["nginx", "-p", workdir, "-c", conf], stderr=subprocess.DEVNULL)
        _wait_listening(self.port, self.proc)

    @staticmethod
    def available() -> bool:
        return shutil.which("nginx") is not None

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
