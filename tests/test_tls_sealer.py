"""The TLS record sealer's invariants (replayer/http/tlsrecord.py, tlskeylog.py): RFC 8448's
record-protection vector; key updates that never reuse a nonce; each secret bound to its own
connection by the client random (a line for another handshake on the context is ignored, and
a connection without its own line is never sealed); a key log whose reader cannot block
OpenSSL's writer; one writer at a time on a connection (a transport still holding a request's
tail is not handed to the launcher); a target the launcher cannot write on left to the loop
without retries. Handshakes here run over memory buffers against a server ``SSLObject``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import threading
import time

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from test_client_faults import prepared
from test_tls import certs  # noqa: F401 - the fixture

import replayer.http.tlskeylog as tlskeylog
import replayer.http.tlsrecord as tlsrecord
from replayer.core import now_ns
from replayer.http import Client
from replayer.http.launcher import Launcher
from replayer.http.tls import TLSOptions
from replayer.http.tlskeylog import KeyLog
from replayer.http.tlsrecord import RecordSealer, TLSSession, client_random, expand_label
from replayer.plan import Planner, Timeline
from replayer.sim.certs import server_context

# RFC 8448 section 3 (Simple 1-RTT Handshake): the client's application traffic secret, the
# write key and IV derived from it, and the client's first application data record (the 50
# bytes 00 01 .. 31) protected with TLS_AES_128_GCM_SHA256
RFC8448_SECRET = bytes.fromhex("9e40646ce79a7f9dc05af8889bce6552875afa0b06df0087f792ebb7c17504a5")
RFC8448_KEY = bytes.fromhex("17422dda596ed5d9acd890e3c63f5051")
RFC8448_IV = bytes.fromhex("5b78923dee08579033e523d9")
RFC8448_RECORD = bytes.fromhex(
    "1703030043a23f7054b62c94d0affafe8228ba55cbefacea42f914aa66bcab3f2b9819a8a5b46b395bd54a9a20441e2b62974e1f5a6292a2977014bd1e3deae63aeebb21694915e4"
)


def test_the_sealer_reproduces_rfc8448s_protected_record():
    assert expand_label(RFC8448_SECRET, b"key", 16, hashes.SHA256) == RFC8448_KEY
    assert expand_label(RFC8448_SECRET, b"iv", 12, hashes.SHA256) == RFC8448_IV
    sealer = RecordSealer("TLS_AES_128_GCM_SHA256", RFC8448_SECRET)
    assert sealer.seal(bytes(range(0x32))) == RFC8448_RECORD
    assert sealer.seq == 1


def _open_records(wire: bytes, secret: bytes) -> list[tuple[int, bytes]]:
    """A reader written from RFC 8446 alone: each record of ``wire`` opened with the key and
    nonce of its place (sequence number from 0, a KeyUpdate moving to the next secret)."""
    out, seq, i = [], 0, 0
    key, iv = expand_label(secret, b"key", 16, hashes.SHA256), expand_label(secret, b"iv", 12, hashes.SHA256)
    while i < len(wire):
        header, n = wire[i : i + 5], int.from_bytes(wire[i + 3 : i + 5], "big")
        nonce = (int.from_bytes(iv, "big") ^ seq).to_bytes(12, "big")
        inner = AESGCM(key).decrypt(nonce, wire[i + 5 : i + 5 + n], header)
        content, kind = inner[:-1], inner[-1]
        out.append((kind, content))
        seq, i = seq + 1, i + 5 + n
        if kind == 0x16 and content[0] == 24:  # KeyUpdate: the next traffic secret
            assert content == b"\x18\x00\x00\x01\x00"  # update_not_requested
            secret = expand_label(secret, b"traffic upd", 32, hashes.SHA256)
            key, iv, seq = (
                expand_label(secret, b"key", 16, hashes.SHA256),
                expand_label(secret, b"iv", 12, hashes.SHA256),
                0,
            )
    return out


def test_key_updates_move_to_the_next_secret_and_never_reuse_a_nonce(monkeypatch):
    """Past ``RECORDS_PER_KEY`` records (here 3), and when the server asked (``update_due``),
    a KeyUpdate is sealed under the old key and the records after it under the next one: an
    independent reader opens every record, each with a nonce used once under its key."""
    monkeypatch.setattr(tlsrecord, "RECORDS_PER_KEY", 3)
    sealer = RecordSealer("TLS_AES_128_GCM_SHA256", RFC8448_SECRET)
    parts = [bytes([i]) * (tlsrecord.MAX_RECORD + 5) for i in range(4)]  # two records each
    wire = b"".join(sealer.seal(p) for p in parts[:2])
    sealer.update_due = True
    wire += b"".join(sealer.seal(p) for p in parts[2:]) + sealer.close_notify()
    opened = _open_records(wire, RFC8448_SECRET)
    assert b"".join(c for k, c in opened if k == 0x17) == b"".join(parts)
    assert opened[-1] == (0x15, b"\x01\x00")  # close_notify, under the key of its place
    kinds = [k for k, _ in opened[:-1]]
    assert kinds.count(0x16) == sealer.updates >= 3 and set(kinds) == {0x16, 0x17}
    runs, n = [], 0  # no key seals more than RECORDS_PER_KEY records (its KeyUpdate included)
    for k in kinds:
        n += 1
        if k == 0x16:
            runs.append(n)
            n = 0
    assert max(runs) <= 3


# -- the secret bound by identity -------------------------------------------------------------
def _contexts(certs):  # noqa: F811
    g = certs["good"]
    server = server_context(g["server_cert"], g["server_key"])
    server.keylog_filename = None
    client = TLSOptions(ca_bundle=g["ca"]).context()
    client.keylog_filename = None
    return server, client


def _pump(client, server: ssl.SSLObject, s_in: ssl.MemoryBIO, s_out: ssl.MemoryBIO) -> None:
    """A full handshake over memory buffers: ``client`` a TLSSession or (SSLObject, in, out)."""
    for _ in range(10):
        if isinstance(client, TLSSession):
            done = client.step()
            s_in.write(client.outgoing())
        else:
            obj, c_in, c_out = client
            try:
                obj.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            s_in.write(c_out.read())
        try:
            server.do_handshake()
        except ssl.SSLWantReadError:
            pass
        back = s_out.read()
        (client.feed if isinstance(client, TLSSession) else client[1].write)(back)
        if done and not back:
            return
    raise AssertionError("the handshake did not complete")


def _server_obj(server_ctx):
    s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    return server_ctx.wrap_bio(s_in, s_out, server_side=True), s_in, s_out


def _plain_handshake(client_ctx, server_ctx) -> None:
    """A handshake on ``client_ctx`` that is none of the sealer's (a probe, a scrape, a thread)."""
    c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = client_ctx.wrap_bio(c_in, c_out, server_hostname="localhost")
    _pump((obj, c_in, c_out), *_server_obj(server_ctx))


def test_each_connection_is_sealed_with_its_own_secret_and_never_with_anothers(certs):  # noqa: F811
    """Another handshake on the pool's context logs a secret nobody expects: ignored. A
    connection whose own line never comes (its handshake was on a context without the key
    log) is not sealed (it would have taken that other connection's secret: one key and one
    nonce sequence for two connections) and its SSLObject writes, which the server reads. A
    connection whose line does come is sealed with exactly its secret: the server reads it."""
    server_ctx, client_ctx = _contexts(certs)
    keylog = KeyLog(client_ctx)
    try:
        _plain_handshake(client_ctx, server_ctx)  # a foreign line in the log
        other_ctx = TLSOptions(ca_bundle=certs["good"]["ca"]).context()
        other_ctx.keylog_filename = None
        results = []
        for ctx in (other_ctx, client_ctx):
            sess = TLSSession(ctx, "localhost", None, keylog)
            server, s_in, s_out = _server_obj(server_ctx)
            _pump(sess, server, s_in, s_out)
            assert len(sess.random) == 32
            s_in.write(sess.wire(b"GET / HTTP/1.1\r\n\r\n"))
            results.append((sess.sealer is not None, sess.unsealed, server.read(1024)))
        ignored = keylog.ignored
    finally:
        keylog.close()
    assert results == [
        (False, tlsrecord.UNSEALED_SECRET, b"GET / HTTP/1.1\r\n\r\n"),
        (True, None, b"GET / HTTP/1.1\r\n\r\n"),
    ]
    assert ignored == 1


def test_client_random_is_read_from_the_client_hello(certs):  # noqa: F811
    _, client_ctx = _contexts(certs)
    c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = client_ctx.wrap_bio(c_in, c_out, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    hello = c_out.read()
    assert client_random(hello) == hello[11:43] and len(set(hello[11:43])) > 8
    assert client_random(b"\x17" + hello[1:]) is None and client_random(hello[:40]) is None


def test_the_key_log_reader_never_blocks_opensslss_writer(certs, monkeypatch):  # noqa: F811
    """Handshakes on the context from a thread, with no connection of the sealer's and the
    loop never reading the log, write far more than the pipe holds (shrunk to one page): its
    own thread drains it, so none of them blocks (and their lines are ignored)."""
    monkeypatch.setattr(tlskeylog, "_PIPE_BYTES", 4096)
    server_ctx, client_ctx = _contexts(certs)
    keylog = KeyLog(client_ctx)
    n = 40  # ~5 lines of ~150 bytes each: ~7 pipes' worth
    try:
        t = threading.Thread(target=lambda: [_plain_handshake(client_ctx, server_ctx) for _ in range(n)], daemon=True)
        t.start()
        t.join(60)
        assert not t.is_alive(), "OpenSSL's key log writer blocked"
        deadline = time.monotonic() + 5
        while keylog.ignored < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert keylog.ignored == n
    finally:
        keylog.close()


# -- one writer at a time ----------------------------------------------------------------------
def test_a_connection_whose_transport_still_holds_a_request_is_not_handed_to_the_launcher():
    """The server answers 400 to a 32 MB request at once and reads its body later: the
    exchange ends with most of the body still in the transport. That connection is not
    reserved for the launcher (its write would go before the tail); the next request is written
    by the loop after the tail, and the server, having read the whole first body, answers it."""
    body_len = 32 << 20
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b"\r\n")[0])
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nbad")
        await asyncio.sleep(0.5)
        await reader.readexactly(body_len)
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b"\r\n")[0])
        n = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1])
        await reader.readexactly(n)
        sse = b'data: {"choices":[{"text":"hi","finish_reason":"length"}],"usage":{"completion_tokens":1}}\n\ndata: [DONE]\n\n'
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(sse), sse)
        )
        await writer.drain()

    async def main():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        launcher = Launcher(priority="default")
        launcher.start()
        try:
            await launcher.ready()
            async with Client(f"http://127.0.0.1:{port}", t0_ns=now_ns(), read_timeout_s=10) as c:
                c.pool.spare_target = 0
                c.use_launcher(launcher)
                big = dataclasses.replace(prepared(0), body=b"a" * body_len)
                first = await asyncio.wait_for(c.send(big, big.new_result(0)), 20)
                conn = c.pool._idle[-1]
                buffered = conn.transport.get_write_buffer_size()
                req = prepared(1)
                res = req.new_result(0)
                reserved = c.reserve(req, res)
                second = await asyncio.wait_for(c.send(req, res, reserved), 20)
                return first, buffered, reserved, second
        finally:
            launcher.stop()
            server.close()

    first, buffered, reserved, second = asyncio.run(main())
    assert first.http_status == 400 and buffered > 0  # (the case provoked: the tail still in the transport)
    assert reserved is None
    assert (second.outcome, second.error) == ("success", None)
    assert seen == [b"POST /v1/completions HTTP/1.1"] * 2


# -- a target the launcher cannot write on -----------------------------------------------------
def test_a_request_the_sender_will_never_take_is_not_offered_again():
    """``not_taken(again=False)`` (the sender said ``LOOP_WRITES``: TLS 1.2): the head is not
    offered again before its due time (it was, every 2 ms for 50 ms), and fires then."""
    plan = Planner(Timeline(), ahead_ns=50_000_000)
    req = prepared(0)
    plan.add(req, 100_000_000, 0)
    h = plan.hand_over(50_000_000)
    assert h is not None and h.req is req
    plan.not_taken(50_000_000, again=False)
    assert all(plan.hand_over(t) is None for t in range(50_000_000, 100_000_000, 1_000_000))
    assert [f.req for f in plan.due(100_000_000)] == [req]
