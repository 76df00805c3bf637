"""The TLS record sealer (replayer/http/tlsrecord.py) against servers of two implementations:
Debian's ``openssl s_server`` and tlslite-ng (a TLS stack in Python, no OpenSSL code), for each
TLS 1.3 cipher suite and the TLS 1.2 fallback, a KeyUpdate from the server with and without
``update_requested``, a close_notify from the server between two requests, and session
resumption. The requests go through the launcher process where the connection is sealed; the
server decrypting and answering each is the proof that the records, their sequence numbers and
the key updates are right. Skipped, with the reason, where a server program is missing (.ci/run
installs them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import pandas as pd
import pytest
from test_client_faults import prepared
from test_tls import _run, _start_sim, certs  # noqa: F401 - the fixture
from tlsservers import SUITES, NginxTerminator, OpenSSLServer, TlsliteServer

from replayer.core import now_ns
from replayer.http import Client
from replayer.http.launcher import Launcher
from replayer.http.tls import TLSOptions
from replayer.send import LauncherSender
from replayer.send.sender import LOOP_WRITES

SERVERS = {"openssl": OpenSSLServer, "tlslite": TlsliteServer}
# (tlslite-ng imports asyncore for an integration this test does not use)
pytestmark = pytest.mark.filterwarnings("ignore:The asyncore module is deprecated:DeprecationWarning")


def _server(kind: str, certs, suite: str, tmp_path, after=None):  # noqa: F811
    cls = SERVERS[kind]
    if not cls.available():
        pytest.skip(f"{kind} is not installed (.ci/run installs it: openssl from Debian, tlslite-ng from PyPI)")
    g = certs["good"]
    options, cipher, version = SUITES[suite]
    if kind == "openssl":
        return OpenSSLServer(g["server_cert"], g["server_key"], options, str(tmp_path))
    return TlsliteServer(g["server_cert"], g["server_key"], cipher, version, after)


@contextlib.asynccontextmanager
async def _client(certs, port: int):  # noqa: F811
    """A Client of ``127.0.0.1:port`` over TLS (the good CA, no spares) writing through a launcher."""
    launcher = Launcher(priority="default")
    launcher.start()
    try:
        await launcher.ready()
        g = certs["good"]
        async with Client(
            f"https://127.0.0.1:{port}",
            t0_ns=now_ns(),
            read_timeout_s=5,
            tls=TLSOptions(ca_bundle=g["ca"], server_name="localhost"),
        ) as c:
            c.pool.spare_target = 0
            c.use_launcher(launcher)
            await c.warm_up(1)
            yield c
    finally:
        launcher.stop()


async def _one(c: Client, i: int, size: int = 16):
    """Send request ``i`` (``size`` prompt tokens) through the launcher where the client can, else the loop."""
    req = prepared(i, size, 1, list(range(100 * i, 100 * i - (-size // 512))))
    res = req.new_result(0)
    reserved = c.reserve(req, res)
    if reserved is not None:
        c.launch(now_ns() + 2_000_000, req, res, reserved)
    return await asyncio.wait_for(c.send(req, res, reserved), 15)


def _ok(results) -> list[tuple[str, str | None]]:
    return [(r.outcome, r.error) for r in results]


@pytest.mark.parametrize("kind", sorted(SERVERS))
@pytest.mark.parametrize("suite", sorted(SUITES))
def test_each_suite_and_the_tls12_fallback(kind, suite, certs, tmp_path):  # noqa: F811
    """TLS 1.3 with each cipher suite: every request sealed here and written by the launcher
    (bodies of several records); TLS 1.2: none sealed, the sender leaves them to the loop at
    once (``LOOP_WRITES``: no hand-over offered again and again), and all answered."""
    server = _server(kind, certs, suite, tmp_path)

    async def main():
        async with _client(certs, server.port) as c:
            results = [await _one(c, i, size) for i, size in enumerate((16, 6000, 16))]
            refusal = None if c.launcher_writes else LauncherSender(c).hand_over(prepared(9), 0)
            p = c.pool
            return results, p.tls_sealed, p.tls_requests_sealed, p.tls_requests_loop, refusal, p.tls_versions

    try:
        results, sealed, launched, looped, refusal, versions = asyncio.run(main())
    finally:
        server.close()
    assert _ok(results) == [("success", None)] * 3
    if suite == "TLS1.2":
        assert versions == {"TLSv1.2": 1} and sealed == 0
        assert (launched, looped) == (0, 3) and refusal is LOOP_WRITES
    else:
        assert versions == {"TLSv1.3": 1} and sealed == 1
        assert (launched, looped) == (3, 0) and refusal is None
    if kind == "tlslite":
        assert server.errors == []


@pytest.mark.parametrize("kind", sorted(SERVERS))
@pytest.mark.parametrize("requested", [True, False], ids=["update_requested", "update_not_requested"])
def test_a_server_key_update(kind, requested, certs, tmp_path):  # noqa: F811
    """The server updates its key after the first answer: with ``update_requested`` the client
    must answer with a KeyUpdate of its own before its next application data (RFC 8446 section
    4.6.3), which the server sees as its client secret moving; without, the client keeps its
    key. Either way the next requests, sealed and written by the launcher, are answered."""
    action = "key_update_requested" if requested else "key_update"
    server = _server(kind, certs, "TLS_AES_128_GCM_SHA256", tmp_path, after={1: action})

    async def main():
        async with _client(certs, server.port) as c:
            first = await _one(c, 0)
            if kind == "openssl":
                server.command(b"K" if requested else b"k")
            else:
                await asyncio.sleep(0.2)
            rest = [await _one(c, i) for i in (1, 2)]
            return [first, *rest], c.pool.tls_key_updates, c.pool.tls_requests_sealed, c.pool.tls_handshakes

    try:
        results, updates, launched, handshakes = asyncio.run(main())
    finally:
        server.close()
    assert _ok(results) == [("success", None)] * 3
    assert handshakes == 1 and launched == 3
    assert updates == (1 if requested else 0)
    seen = server.got_key_updates() if kind == "openssl" else server.client_updates
    assert seen == (1 if requested else 0)
    if kind == "tlslite":
        assert server.errors == []


def test_a_close_notify_between_two_requests_retires_the_connection_at_once(certs, tmp_path):  # noqa: F811
    """The server sends close_notify after the first answer and leaves the TCP connection open:
    the connection is closed at once (no FIN to wait for), so the second request goes out on a
    new connection and is answered (handed out, it would have been a stale_connection)."""
    server = _server("tlslite", certs, "TLS_AES_256_GCM_SHA384", tmp_path, after={1: "close_notify"})

    async def main():
        async with _client(certs, server.port) as c:
            first = await _one(c, 0)
            await asyncio.sleep(0.3)  # the close_notify arrives; no FIN behind it
            second = await _one(c, 1)
            return [first, second], c.pool.tls_handshakes

    try:
        results, handshakes = asyncio.run(main())
    finally:
        server.close()
    assert _ok(results) == [("success", None)] * 2
    assert handshakes == 2


@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_session_resumption(kind, certs, tmp_path):  # noqa: F811
    """A connection opened after the first exchange (the server's tickets arrived) resumes its
    session, and is sealed like a full handshake's (its own secret, from its own key-log line)."""
    server = _server(kind, certs, "TLS_CHACHA20_POLY1305_SHA256", tmp_path)

    async def main():
        async with _client(certs, server.port) as c:
            first = await _one(c, 0)
            for conn in list(c.pool._idle):  # (s_server serves one connection at a time)
                conn.close()
            await asyncio.sleep(0.2)
            await c.warm_up(1)
            second = await _one(c, 1)
            p = c.pool
            return [first, second], p.tls_handshakes, p.tls_resumed, p.tls_sealed, p.tls_requests_sealed

    try:
        results, handshakes, resumed, sealed, launched = asyncio.run(main())
    finally:
        server.close()
    assert _ok(results) == [("success", None)] * 2
    assert (handshakes, resumed, sealed) == (2, 1, 2) and launched == 2


@pytest.fixture(scope="module")
def plain_sim(tmp_path_factory):
    """A `replayer sim` serving plain HTTP (behind the terminators)."""
    p, url = _start_sim(tmp_path_factory.mktemp("plainsim"), "plain")
    yield url
    p.terminate()
    p.wait(10)


def test_a_replay_through_tls_terminators_completes_every_request(plain_sim, certs, tmp_path):  # noqa: F811
    """Black box: one `replayer run` over four targets, each an nginx terminator configured for
    one TLS 1.3 suite or TLS 1.2 in front of the simulator (requests go round robin): every
    request to every target completes, written by the launcher (sealed) over TLS 1.3 and by the
    loop over TLS 1.2, as the summary's tls section counts."""
    if not NginxTerminator.available():
        pytest.skip("nginx is not installed (.ci/run installs Debian's nginx-light)")
    g = certs["good"]
    upstream = int(plain_sim.rsplit(":", 1)[1])
    terminators = {}
    try:
        for suite in sorted(SUITES):
            terminators[suite] = NginxTerminator(
                g["server_cert"], g["server_key"], suite, upstream, str(tmp_path / suite)
            )
        targets = [a for t in terminators.values() for a in ("--target", f"https://127.0.0.1:{t.port}")]
        r = _run(tmp_path, *targets, "--ca-bundle", g["ca"], "--num-prompts", "40")
    finally:
        for t in terminators.values():
            t.close()
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert (s["completed"], s["failed"]) == (40, 0)
    rows = pd.concat(pd.read_parquet(f) for f in sorted((tmp_path / "results").glob("requests*.parquet")))
    by_suite = {suite: rows[rows.target == f"https://127.0.0.1:{t.port}"] for suite, t in terminators.items()}
    assert {suite: (len(x), set(x.outcome)) for suite, x in by_suite.items()} == {
        suite: (10, {"success"}) for suite in SUITES
    }
    tls = s["tls"]
    assert set(tls["versions"]) == {"TLSv1.3", "TLSv1.2"}
    assert tls["sealed"] == tls["versions"]["TLSv1.3"] and tls["unmatched"] == 0
    assert tls["requests_sealed"] + tls["requests_loop"] == 40 and tls["requests_loop"] >= 10  # (TLS 1.2: the loop's)
    assert tls["requests_sealed"] >= 24  # (TLS 1.3: the launcher's, bar a request that found no idle connection)
    assert "TLS requests sealed / by the loop" in r.stdout
