"""Memory after a backlog: how much of what a burst of N requests in flight took does the client
give back once the burst is over?

    .venv/bin/python bench/bench_backlog_memory.py [--requests 3000] [--expiry 1]

Prints numbers, asserts nothing. A ``replayer sim`` process (TTFT 1.5 s, so the requests pile
up; every port on 127.0.0.1) gets N requests at once from one ``Client`` (one connection each),
then, after ``--expiry`` + 0.5 s, a few more. RSS of this process (psutil) before the burst, right
after it, and after the few more: with ``idle_expiry_s=--expiry`` the connections beyond the
spares are closed by then; ``--expiry 0`` keeps the client's default (60 s), so nothing has
expired yet. Then the pool is cut to its spares by hand and ``malloc_trim`` runs, to show what
the rest is (memory the allocators keep, not the pool).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import resource
import socket
import subprocess
import sys

import psutil

from replayer.core.clock import now_ns
from replayer.core.request import PreparedRequest
from replayer.http.client import Client
from replayer.http.pool import IDLE_EXPIRY_S
from replayer.payload.body import PayloadBuilder
from replayer.payload.prompts import PromptBuilder


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


async def _burst(port: int, n: int, expiry_s: float) -> None:
    for _ in range(200):  # the sim is up when it accepts
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            break
        except OSError:
            await asyncio.sleep(0.1)
    body = PayloadBuilder("m").body(PromptBuilder(block_size=16).prompt_json([1], 16), 2)

    def req(i: int) -> PreparedRequest:
        return PreparedRequest(
            index=i, row=i, due_ns=0, body=body, input_length=16, output_length=2, prompt_len=16, max_tokens=2
        )

    async with Client(f"http://127.0.0.1:{port}", t0_ns=now_ns(), idle_expiry_s=expiry_s or IDLE_EXPIRY_S) as c:
        for i in range(3):
            await c.send(req(i), req(i).new_result(0))
        gc.collect()
        before = _rss_mb()
        res = await asyncio.gather(*(c.send(req(i), req(i).new_result(0)) for i in range(n)))
        ok = sum(1 for r in res if r.outcome == "success")
        del res
        gc.collect()
        after = _rss_mb()
        await asyncio.sleep((expiry_s or 0) + 0.5)
        for i in range(3):
            await c.send(req(i), req(i).new_result(0))
        gc.collect()
        later = _rss_mb()
        print(f"requests in flight          {n} ({ok} succeeded)")
        print(f"idle expiry                 {expiry_s or IDLE_EXPIRY_S:g} s")
        print(f"RSS before the burst        {before:.1f} MB")
        print(f"RSS right after it          {after:.1f} MB ({after - before:+.1f})")
        print(
            f"RSS after {expiry_s + 0.5:g} s and 3 more   {later:.1f} MB ({later - before:+.1f}); "
            f"idle pool {len(c.pool._idle)}, open {c.open_connections}"
        )
        while len(c.pool._idle) > c.pool.spare_target:
            x = c.pool._idle.popleft()
            x._abort()
            c.pool._all.discard(x)
        await asyncio.sleep(0.5)
        gc.collect()
        cut = _rss_mb()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        print(
            f"pool cut to its spares      {cut:.1f} MB ({cut - before:+.1f}); after malloc_trim "
            f"{_rss_mb():.1f} MB (the rest: memory the allocators keep)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--expiry", type=float, default=1.0, help="idle_expiry_s of the client (0: its default)")
    a = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayer",
            "sim",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--ttft-base-ms",
            "1500",
            "--itl-base-ms",
            "1",
            "--prefill-us-per-token",
            "0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        asyncio.run(_burst(port, a.requests, a.expiry))
    finally:
        sim.terminate()
        sim.wait()


if __name__ == "__main__":
    main()
