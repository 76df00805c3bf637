"""TLS towards the target, as staging deployments have it: a private CA (--ca-bundle), mutual TLS
(--client-cert/--client-key), a server name apart from the URL's host (--tls-server-name),
--insecure; and each TLS failure named by its cause with the server's certificate, at start-up
(exit 2) and on the hot path (failure kind tls_error), never a traceback.

The servers are real: `replayer sim --tls-cert` processes with throw-away certificates from
`replayer tls-certs` (a private CA, an expired set, a CA the client does not know).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from conftest import wait_sim_url
from test_capture import capture_rows
from test_capture_roundtrip import start_record, stop_record
from test_client_faults import prepared, result_for

import replayer.http.tlsrecord as tlsrecord
from replayer.core import RequestResult, now_ns
from replayer.http import Client
from replayer.http.launcher import Launcher
from replayer.http.tls import TLSOptions
from replayer.observe import TargetScraper
from replayer.sim import SimConfig, SimServer
from replayer.sim.certs import server_context, write_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """Three sets of PEM files: ``good`` (the servers' CA and certificates), ``other`` (a CA the
    servers' certificates are not signed by), ``expired`` (certificates that ended an hour ago)."""
    root = tmp_path_factory.mktemp("certs")
    return {
        "good": write_certs(str(root / "good")),
        "other": write_certs(str(root / "other")),
        "expired": write_certs(str(root / "expired"), expired=True),
    }


def _start_sim(tmp, name: str, *args: str) -> tuple[subprocess.Popen, str]:
    err = tmp / f"{name}.stderr"
    with open(err, "wb") as fh:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "replayer",
                "sim",
                "--accept-any-model",  # (the tests' requests name model m)
                "--port",
                "0",
                "--ttft-base-ms",
                "5",
                "--itl-base-ms",
                "1",
                *args,
            ],
            stderr=fh,
        )
    return p, wait_sim_url(p, err)  # (it says where it serves once it listens)


@pytest.fixture(scope="module")
def sims(certs, tmp_path_factory):
    """TLS simulators: ``tls`` (good certificate), ``mtls`` (also requires a client certificate
    of the good CA), ``expired`` (an expired certificate)."""
    tmp = tmp_path_factory.mktemp("sims")
    g, x = certs["good"], certs["expired"]
    procs = {
        "tls": _start_sim(tmp, "tls", "--tls-cert", g["server_cert"], "--tls-key", g["server_key"]),
        "mtls": _start_sim(
            tmp, "mtls", "--tls-cert", g["server_cert"], "--tls-key", g["server_key"], "--tls-client-ca", g["ca"]
        ),
        "expired": _start_sim(tmp, "expired", "--tls-cert", x["server_cert"], "--tls-key", x["server_key"]),
    }
    yield {k: url for k, (_, url) in procs.items()}
    for p, _ in procs.values():
        p.terminate()
        p.wait(10)


def _run(tmp, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            "--request-rate",
            "20",
            "--num-prompts",
            "10",
            "--input-len",
            "32",
            "--output-len",
            "8",
            "--admin-port",
            "0",
            "--ready-timeout",
            "30",
            "--results",
            str(tmp / "results"),
            "--quiet",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_replay_over_tls_with_a_private_ca(tmp_path, sims, certs):
    r = _run(tmp_path, "--target", sims["tls"], "--ca-bundle", certs["good"]["ca"])
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert summary["completed"] == 10 and summary["failed"] == 0
    assert "tls_insecure" not in summary
    tls = summary["tls"]
    assert tls["handshakes"] >= 1 and 0 <= tls["resumed"] < tls["handshakes"]
    assert tls["versions"] == {"TLSv1.3": tls["handshakes"]} and tls["sealed"] == tls["handshakes"]
    assert "TLS handshakes (resumed)" in r.stdout and "TLSv1.3" in r.stdout


def test_mutual_tls_required_and_given(tmp_path, sims, certs):
    g = certs["good"]
    r = _run(
        tmp_path, "--target", sims["mtls"], "--ca-bundle", g["ca"], "--client-cert", g["client_cert"],
        "--client-key", g["client_key"],
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "results" / "summary.json").read_text())["completed"] == 10


@pytest.mark.parametrize(
    "case, cause",
    [
        ("wrong_name", "name mismatch"),
        ("unknown_ca", "unknown CA"),
        ("expired", "expired certificate"),
        ("client_cert_missing", "requires a client certificate"),
    ],
)
def test_each_tls_failure_is_one_clear_start_up_error(tmp_path, sims, certs, case, cause):
    g = certs["good"]
    args = {
        "wrong_name": ["--target", sims["tls"], "--ca-bundle", g["ca"], "--tls-server-name", "wrong.example"],
        "unknown_ca": ["--target", sims["tls"], "--ca-bundle", certs["other"]["ca"]],
        "expired": ["--target", sims["expired"], "--ca-bundle", certs["expired"]["ca"]],
        "client_cert_missing": ["--target", sims["mtls"], "--ca-bundle", g["ca"]],
    }[case]
    t = time.monotonic()
    r = _run(tmp_path, *args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "replayer: error: TLS error with https://127.0.0.1:" in r.stderr and cause in r.stderr, r.stderr
    if case != "client_cert_missing":  # a verification failure names the certificate the server showed
        assert "certificate subject CN=localhost" in r.stderr and "names localhost, 127.0.0.1" in r.stderr
    assert time.monotonic() - t < 25  # at once, not after --ready-timeout 30 s: waiting mends nothing
    assert not (tmp_path / "results").exists()  # nothing was sent: no results folder left


def test_insecure_skips_verification_and_says_so_at_start_and_in_the_summary(tmp_path, sims):
    r = _run(tmp_path, "--target", sims["expired"], "--insecure")
    assert r.returncode == 0, r.stderr
    assert "--insecure: the TLS certificate of https://" in r.stderr and "NOT verified" in r.stderr
    assert json.loads((tmp_path / "results" / "summary.json").read_text())["tls_insecure"] is True


def test_bad_tls_files_are_config_errors(tmp_path, certs):
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    r = _run(tmp_path, "--target", "https://127.0.0.1:1", "--ca-bundle", str(not_pem))
    assert r.returncode == 2 and "--ca-bundle" in r.stderr and "Traceback" not in r.stderr
    r = _run(tmp_path, "--target", "https://127.0.0.1:1", "--client-key", certs["good"]["client_key"])
    assert r.returncode == 2 and "--client-key needs --client-cert" in r.stderr
    # a certificate file without its key, and no --client-key: the message says where the key goes
    r = _run(tmp_path, "--target", "https://127.0.0.1:1", "--client-cert", certs["good"]["client_cert"])
    assert r.returncode == 2 and "give the key's file with --client-key" in r.stderr, r.stderr


def test_a_plain_http_target_on_a_tls_port_is_named_at_once(tmp_path, sims, certs):
    """http:// to a port that speaks TLS: one start-up error saying so (exit 2) at once, not a
    wait for --ready-timeout ending in "server disconnected"; TLS options given for an http://
    target are said not to apply."""
    t = time.monotonic()
    r = _run(tmp_path, "--target", sims["tls"].replace("https://", "http://"), "--ca-bundle", certs["good"]["ca"])
    assert r.returncode == 2, r.stderr
    assert "the server speaks TLS on this port (an https:// target" in r.stderr, r.stderr
    assert "is an http:// target: the TLS options" in r.stderr
    assert time.monotonic() - t < 25  # (--ready-timeout is 30 s)


def test_a_tls_server_that_never_handshakes_is_named_when_readiness_gives_up(tmp_path):
    """A port that accepts TCP and never answers the TLS handshake (a server still starting, or
    not TLS): readiness keeps waiting (it may be starting), then names the handshake timeout."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    try:
        r = _run(tmp_path, "--target", f"https://127.0.0.1:{srv.getsockname()[1]}", "--ready-timeout", "2")
    finally:
        srv.close()
    assert r.returncode == 2, r.stderr
    assert "not ready after 2 s (handshake timeout: the TCP connection opens but no TLS handshake" in r.stderr, r.stderr


def _send_one(url: str, tls: TLSOptions, connect_timeout_s: float = 10.0) -> RequestResult:
    req = prepared(0, 8, 2)

    async def main() -> RequestResult:
        async with Client(url, tls=tls, connect_timeout_s=connect_timeout_s) as c:
            return await c.send(req, result_for(req))

    return asyncio.run(main())


def test_hot_path_tls_failures_are_tls_error_naming_the_certificate(sims, certs):
    ok = _send_one(sims["tls"], TLSOptions(ca_bundle=certs["good"]["ca"]))
    assert ok.outcome == "success", ok.error
    bad = _send_one(sims["tls"], TLSOptions(ca_bundle=certs["other"]["ca"]))
    assert bad.outcome == "failed" and bad.error_kind == "tls_error"
    assert "unknown CA" in bad.error and "certificate subject CN=localhost" in bad.error
    mtls = _send_one(sims["mtls"], TLSOptions(ca_bundle=certs["good"]["ca"]))
    assert mtls.outcome == "failed" and mtls.error_kind in ("tls_error", "disconnect"), mtls.error


def test_a_handshake_that_never_comes_is_a_tls_handshake_timeout():
    """A server that accepts TCP and never speaks TLS: tls_error "handshake timeout", not a
    connect timeout (the TCP connection was made)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    try:
        res = _send_one(f"https://127.0.0.1:{srv.getsockname()[1]}", TLSOptions(), connect_timeout_s=0.5)
    finally:
        srv.close()
    assert res.error_kind == "tls_error" and "handshake timeout" in res.error, res.error


def test_the_target_metrics_scrape_uses_the_tls_options(sims, certs):
    url = sims["mtls"] + "/metrics"
    g = certs["good"]
    mtls = TLSOptions(ca_bundle=g["ca"], client_cert=g["client_cert"], client_key=g["client_key"])

    async def scrape(tls: TLSOptions) -> TargetScraper:
        import aiohttp

        s = TargetScraper(url, tls=tls)
        async with aiohttp.ClientSession() as session:
            await s.scrape_once(session)
        return s

    good = asyncio.run(scrape(mtls))
    assert good.errors == 0 and good.scrapes == 1 and good.latest
    bad = asyncio.run(scrape(TLSOptions(ca_bundle=certs["other"]["ca"])))
    assert bad.errors == 1 and bad.last_error.startswith("TLS error: unknown CA")


def test_record_upstream_over_mutual_tls(tmp_path, sims, certs):
    g = certs["good"]
    out = tmp_path / "cap"
    p, url = start_record(
        out, sims["mtls"], "--ca-bundle", g["ca"], "--client-cert", g["client_cert"], "--client-key", g["client_key"],
        "--no-upstream-tokenize", "--flush-interval", "0.2",
    )  # fmt: skip
    try:
        body = json.dumps({"model": "sim-model", "prompt": [5, 6, 7, 8], "max_tokens": 3, "stream": True}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200 and b"[DONE]" in r.read()
    finally:
        stop_record(p)
    rows = capture_rows(out)
    assert len(rows) == 1 and rows[0]["output_length"] == 3


def test_record_upstream_with_an_unknown_ca_answers_502_naming_it(tmp_path, sims, certs):
    out = tmp_path / "cap"
    p, url = start_record(out, sims["tls"], "--ca-bundle", certs["other"]["ca"], "--no-upstream-tokenize")
    try:
        body = json.dumps({"model": "sim-model", "prompt": [5, 6], "max_tokens": 1}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=60)
        assert e.value.code == 502 and b"TLS error: unknown CA" in e.value.read()
    finally:
        stop_record(p)


@contextlib.asynccontextmanager
async def _tls_sim_client(certs, **sim_config):
    """An in-process simulator serving TLS with the good certificate (its own key log off), and a
    Client trusting its CA with no spares opened in the background: (simulator, client)."""
    g = certs["good"]
    ctx = server_context(g["server_cert"], g["server_key"])
    ctx.keylog_filename = None  # (the server's lines stay out of an SSLKEYLOGFILE a test sets)
    sim = SimServer(SimConfig(**{"accept_any_model": True, **sim_config}))  # (the tests' requests name model m)
    url = await sim.start("127.0.0.1", 0, ctx)
    try:
        async with Client(url, t0_ns=now_ns(), tls=TLSOptions(ca_bundle=g["ca"], server_name="localhost")) as c:
            c.pool.spare_target = 0
            yield sim, c
    finally:
        await sim.stop()


def test_the_launcher_process_writes_tls_requests_and_new_connections_resume_the_session(certs):
    """TLS 1.3 requests go out from the launcher process as records sealed by the loop
    (replayer.http.tlsrecord): the reservation succeeds over TLS and a real OpenSSL server
    (the simulator's) decrypts them and answers every one, on the same connection again and
    again (the records' sequence numbers are right); each connection opened after the first
    exchange resumes the session the server gave (no full handshake)."""

    async def main():
        launcher = Launcher(priority="default")
        try:
            async with _tls_sim_client(certs, record_requests=True) as (sim, c):
                launcher.start()
                await launcher.ready()
                c.use_launcher(launcher)
                await c.warm_up(1)
                results, reserved_n = [], 0
                for i in range(6):  # one connection, six exchanges: 12+ records in sequence
                    n = 3000 * (i + 1)  # tokens: bodies up to ~100 KB, several records each
                    req = prepared(i, n, 2, list(range(100 * i, 100 * i + -(-n // 512))))
                    res = req.new_result(0)
                    reserved = c.reserve(req, res)
                    reserved_n += reserved is not None
                    if reserved is not None:
                        c.launch(now_ns() + 5_000_000, req, res, reserved)
                    results.append(await asyncio.wait_for(c.send(req, res, reserved), 10))
                opened = await c.warm_up(3)  # new connections, after the server's tickets arrived
                return (
                    results,
                    reserved_n,
                    launcher.launched,
                    len(sim.records),
                    opened,
                    c.pool.tls_handshakes,
                    c.pool.tls_resumed,
                )
        finally:
            launcher.stop()

    results, reserved_n, launched, seen, opened, handshakes, resumed = asyncio.run(main())
    assert [(r.outcome, r.error) for r in results] == [("success", None)] * 6
    assert reserved_n == launched == seen == 6  # every request written by the launcher, each answered
    assert opened == 3 and handshakes == 4 and resumed == 3


def test_a_sealer_whose_key_sealed_its_share_of_records_updates_its_key(certs, monkeypatch):
    """AES-GCM limits the records one key may seal (RFC 8446 section 5.5): past
    ``RECORDS_PER_KEY`` the sealer sends a KeyUpdate under the old key and seals on under the
    next traffic secret (section 7.2), sequence numbers from 0. Here the limit is lowered to 2
    records: the simulator's OpenSSL reads every request, so each update was right."""
    monkeypatch.setattr(tlsrecord, "RECORDS_PER_KEY", 2)

    async def main():
        async with _tls_sim_client(certs) as (_, c):
            out = []
            for i in range(4):
                req = prepared(i)
                out.append(await asyncio.wait_for(c.send(req, result_for(req)), 10))
            return out, c.pool.tls_handshakes, c.pool.tls_key_updates

    results, handshakes, updates = asyncio.run(main())
    assert [(r.outcome, r.error) for r in results] == [("success", None)] * 4
    assert handshakes == 1 and updates == 3  # one key per two records: requests 2, 3 and 4 each began with an update


def test_sslkeylogfile_still_gets_the_secrets_for_a_packet_capture(certs, tmp_path, monkeypatch):
    """The record sealers read the key log through a pipe of their own; a key log file the user
    asked for (``SSLKEYLOGFILE``, to decrypt a capture in Wireshark) still gets every
    connection's secrets, and the requests still go out sealed by the replayer."""
    keylog = tmp_path / "keys.log"
    monkeypatch.setenv("SSLKEYLOGFILE", str(keylog))

    async def main():
        async with _tls_sim_client(certs) as (_, c):
            await c.warm_up(2)
            sealed = [conn.tls is not None and conn.tls.sealer is not None for conn in c.pool._idle]
            req = prepared(0)
            res = await asyncio.wait_for(c.send(req, result_for(req)), 10)
            return sealed, res

    sealed, res = asyncio.run(main())
    assert sealed == [True, True] and res.outcome == "success"
    lines = keylog.read_text().splitlines()
    assert sum(line.startswith("CLIENT_TRAFFIC_SECRET_0 ") for line in lines) == 2, lines
