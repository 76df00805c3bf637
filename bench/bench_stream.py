"""Client CPU per streamed token, end to end (issue 7's CPU target is mostly this cost).

    .venv/bin/python bench/bench_stream.py [--streams 120] [--tokens 500] [--waves 2] [--target URL]

W1 (issue 7) streams ~620k tokens to 1,750 requests, about 120 at a time, one SSE event every
10 ms per stream; each event is one TCP read. This runs the same shape: ``--streams`` concurrent
``/v1/completions`` streams (8-token prompts, starts spread over 10 ms) of ``--tokens`` tokens
each, ``--waves`` times, through the real ``Client`` (uvloop, httptools, SSE decode, accounting)
against a ``replayer sim`` in its own process (TTFT 20 ms, ITL 10 ms) or ``--target`` (``--tls``: the simulator serves TLS). Prints the
client process's user and system CPU per event (``getrusage`` over the waves, imports and
warm-up excluded), voluntary context switches and events/s. A read costs a syscall plus the ACK
it sends (on loopback the ACK's processing runs in the reader's syscall too), so system time per
event is part of the price of per-token timing; ``--delayed-ack`` (as ``replayer run
--delayed-ack``) halves the ACKs. Bodies ask for ``continuous_usage_stats`` as ``replayer run``
sends them (usage on every event); ``--no-continuous-usage`` asks for usage at the end only.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

import orjson
import uvloop

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from replayer.core.clock import now_ns  # noqa: E402
from replayer.core.request import PreparedRequest  # noqa: E402
from replayer.core.result import RequestResult  # noqa: E402
from replayer.http.client import Client  # noqa: E402
from replayer.http.tls import TLSOptions  # noqa: E402
from replayer.sim.certs import write_certs  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_sim(certs: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    tls = ["--tls-cert", certs["server_cert"], "--tls-key", certs["server_key"]] if certs else []
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayer",
            "sim",
            "--port",
            str(port),
            "--ttft-base-ms",
            "20",
            "--prefill-us-per-token",
            "0",
            "--itl-base-ms",
            "10",
            "--itl-per-running-us",
            "0",
            "--max-num-seqs",
            "0",
            "--prefix-cache-tokens",
            "0",
            *tls,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"{'https' if certs else 'http'}://127.0.0.1:{port}"
    ctx = ssl.create_default_context(cafile=certs["ca"]) if certs else None
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            urllib.request.urlopen(url + "/health", timeout=1, context=ctx).read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("replayer sim did not start within 30 s")


async def _run(
    url: str,
    streams: int,
    tokens: int,
    waves: int,
    model: str,
    delayed_ack: bool,
    continuous_usage: bool,
    tls: TLSOptions | None = None,
) -> None:
    stream_options = {"include_usage": True, "continuous_usage_stats": continuous_usage}
    body = orjson.dumps(
        {
            "model": model,
            "prompt": list(range(1, 9)),
            "max_tokens": tokens,
            "min_tokens": tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": stream_options,
        }
    )
    async with Client(url, t0_ns=now_ns(), delayed_ack=delayed_ack, tls=tls) as client:
        await client.warm_up(streams)

        async def one(i: int) -> RequestResult:
            await asyncio.sleep(0.01 * i / streams)  # starts spread as the trace's arrivals are
            req = PreparedRequest(
                index=i,
                row=i,
                due_ns=0,
                body=body,
                input_length=8,
                output_length=tokens,
                prompt_len=8,
                max_tokens=tokens,
            )
            return await client.send(req, RequestResult(row=i))

        r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        events = failed = 0
        for _ in range(waves):
            for r in await asyncio.gather(*(one(i) for i in range(streams))):
                events += r.n_chunks
                failed += r.outcome != "success"
        r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    user, sys_ = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    per = 1e6 / max(events, 1)
    print(
        f"{streams} streams x {tokens} tokens x {waves} waves: {events} events in {w1 - w0:.1f} s "
        f"({events / (w1 - w0):,.0f}/s), {failed} failed"
    )
    print(
        f"client CPU per event: user {user * per:.1f} us + system {sys_ * per:.1f} us "
        f"= {(user + sys_) * per:.1f} us; voluntary context switches "
        f"{(r1.ru_nvcsw - r0.ru_nvcsw) / max(events, 1):.2f} per event"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=120)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--waves", type=int, default=2)
    ap.add_argument("--target", help="an OpenAI-compatible server on 127.0.0.1 (default: a replayer sim)")
    ap.add_argument("--model", default="sim-model")
    ap.add_argument("--delayed-ack", action="store_true", help="as replayer run --delayed-ack")
    ap.add_argument(
        "--no-continuous-usage",
        action="store_true",
        help="usage only at the end (as --no-vllm-extensions), not on every event",
    )
    ap.add_argument("--tls", action="store_true", help="the simulator serves TLS (throw-away certificates)")
    a = ap.parse_args()
    if a.target and not a.target.startswith(("http://127.0.0.1", "http://localhost")):
        raise SystemExit("--target must be on 127.0.0.1 (benchmarks stay on this host)")
    tmp = tempfile.mkdtemp(prefix="bench-stream-")
    certs = write_certs(tmp) if a.tls else None
    proc, url = (None, a.target) if a.target else _start_sim(certs)
    tls = TLSOptions(ca_bundle=certs["ca"], server_name="localhost") if certs else None
    try:
        uvloop.run(_run(url, a.streams, a.tokens, a.waves, a.model, a.delayed_ack, not a.no_continuous_usage, tls))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if proc is not None:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
