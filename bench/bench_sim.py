"""Benchmark of replayer.sim: per-request parse+hash cost and sustained streaming rate.

Prints numbers, asserts nothing. Usage (from the repo root):

    .venv/bin/python bench/bench_sim.py [--streams 150] [--seconds 5] [--prompt-tokens 14000]
                                        [--max-tokens 100] [--inprocess]

Part 1 times, for one prompt of ``--prompt-tokens`` random ids, each step the sim does per
request: orjson.loads of the body, list -> int64 array, range check, prefix block hashes,
LRU lookup+insert. Part 2 runs the sim (a separate process by default, so the client's CPU
does not count against it; ``--inprocess`` shares one uvloop like the daemon does) and keeps
``--streams`` streaming requests in flight for ``--seconds``, reporting completed requests,
tokens/s, the client-observed mean inter-token gap versus the model's step time, and the
CPU seconds used by the server and the client.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from replayer.sim import PrefixCache, SimConfig, SimServer, prompt_block_hashes  # noqa: E402


def _best_us(fn, n: int = 200, reps: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


def bench_parse_hash(prompt_tokens: int) -> None:
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 32000, prompt_tokens).tolist()
    body = orjson.dumps(
        {"prompt": prompt, "max_tokens": 100, "stream": True, "stream_options": {"include_usage": True}}
    )
    parsed = orjson.loads(body)["prompt"]
    ids = np.fromiter(parsed, dtype=np.int64, count=len(parsed))
    keys = prompt_block_hashes(ids, 16)
    cache = PrefixCache(4_000_000 // 16)
    cache.lookup_and_insert(keys)
    rows = [
        ("orjson.loads body", _best_us(lambda: orjson.loads(body))),
        ("np.fromiter -> int64", _best_us(lambda: np.fromiter(parsed, dtype=np.int64, count=len(parsed)))),
        ("min/max range check", _best_us(lambda: (int(ids.min()), int(ids.max())))),
        ("prompt_block_hashes (16)", _best_us(lambda: prompt_block_hashes(ids, 16))),
        ("LRU lookup+refresh (hit)", _best_us(lambda: cache.lookup_and_insert(keys))),
    ]
    print(f"== per-request cost, {prompt_tokens}-token prompt ({len(body)} B body), best of 5")
    for name, us in rows:
        print(f"  {name:28s} {us:8.1f} us")
    print(f"  {'total':28s} {sum(u for _, u in rows):8.1f} us")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(url: str, streams: int, seconds: float, prompt_tokens: int, max_tokens: int) -> dict:
    rng = np.random.default_rng(1)
    # 8 shared "system prompts" of half the length, so the prefix cache gets hits.
    heads = [rng.integers(0, 32000, prompt_tokens // 2).tolist() for _ in range(8)]
    stop_at = time.perf_counter() + seconds
    stats = {"requests": 0, "tokens": 0, "gap_sum": 0.0, "gaps": 0, "errors": 0}

    async def worker(c: aiohttp.ClientSession, i: int) -> None:
        k = 0
        while time.perf_counter() < stop_at:
            k += 1
            prompt = heads[(i + k) % 8] + rng.integers(0, 32000, prompt_tokens - prompt_tokens // 2).tolist()
            body = orjson.dumps(
                {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
            )
            try:
                async with c.post(
                    url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
                ) as r:
                    n, first, last = 0, 0.0, 0.0
                    async for chunk in r.content.iter_any():
                        now = time.perf_counter()
                        m = chunk.count(b"\n\n")
                        if m and not n:
                            first = now
                        n += m
                        last = now
                tokens = n - 2  # minus usage event and [DONE]
                stats["requests"] += 1
                stats["tokens"] += tokens
                if tokens > 1:
                    stats["gap_sum"] += (last - first) / (tokens - 1)
                    stats["gaps"] += 1
            except aiohttp.ClientError:
                stats["errors"] += 1

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as c:
        await asyncio.gather(*(worker(c, i) for i in range(streams)))
    stats["wall"] = time.perf_counter() - t0
    return stats


def bench_streams(args: argparse.Namespace) -> None:
    import uvloop

    cfg = SimConfig()
    step_ms = cfg.itl_base_ms + cfg.itl_per_running_us * args.streams / 1000
    print(
        f"== {args.streams} concurrent streams for {args.seconds:g} s, "
        f"{args.prompt_tokens}-token prompts, max_tokens {args.max_tokens}, "
        f"sim {'in-process' if args.inprocess else 'in a separate process'}"
    )
    proc = None
    cpu_client0 = time.process_time()
    if args.inprocess:

        async def run_inproc():
            sim = SimServer(cfg)
            url = await sim.start()
            try:
                return await _load(url, args.streams, args.seconds, args.prompt_tokens, args.max_tokens)
            finally:
                await sim.stop()

        stats = uvloop.run(run_inproc())
        server_cpu = None
    else:
        port = _free_port()
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from replayer.sim import main; sys.exit(main())", "--port", str(port)],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"

            async def wait_and_run():
                async with aiohttp.ClientSession() as c:
                    for _ in range(200):
                        try:
                            async with c.get(url + "/health"):
                                break
                        except aiohttp.ClientError:
                            await asyncio.sleep(0.05)
                cpu0 = _proc_cpu_s(proc.pid)
                st = await _load(url, args.streams, args.seconds, args.prompt_tokens, args.max_tokens)
                st["server_cpu"] = _proc_cpu_s(proc.pid) - cpu0
                return st

            stats = uvloop.run(wait_and_run())
            server_cpu = stats["server_cpu"]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
    client_cpu = time.process_time() - cpu_client0
    wall = stats["wall"]
    print(f"  requests completed   {stats['requests']}  ({stats['requests'] / wall:.1f}/s), errors {stats['errors']}")
    print(f"  output tokens        {stats['tokens']}  ({stats['tokens'] / wall:.0f} tokens/s)")
    if stats["gaps"]:
        print(
            f"  mean inter-token gap {stats['gap_sum'] / stats['gaps'] * 1000:.2f} ms "
            f"(model step at {args.streams} running: {step_ms:.2f} ms)"
        )
    if server_cpu is not None:
        print(f"  server CPU           {server_cpu:.2f} s over {wall:.2f} s ({server_cpu / wall * 100:.0f}% of a core)")
    print(f"  client CPU           {client_cpu:.2f} s{' (includes the in-process sim)' if args.inprocess else ''}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=150)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--prompt-tokens", type=int, default=14000)
    p.add_argument("--max-tokens", type=int, default=100)
    p.add_argument("--inprocess", action="store_true")
    args = p.parse_args()
    bench_parse_hash(args.prompt_tokens)
    bench_streams(args)


if __name__ == "__main__":
    main()
