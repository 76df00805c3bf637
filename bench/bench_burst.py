"""Burst benchmark (case B24 of shared/cases/client-faults.md): N requests due at the same instant.

    .venv/bin/python bench/bench_burst.py [--n 300] [--rounds 3] [--cold] [--profile FILE]

A ``replayer sim`` in its own process (TTFT 2000 ms, 50 tokens in ~100 ms) is the target. Each
round builds N bodies in the lead window (16 tokens each, as in B24), fills the keep-alive pool
with N idle connections (unless ``--cold``), anchors t = 0 300 ms ahead and lets the real
Dispatcher + Client send all N at t = 0. Prints, per round: dispatch lag p50/p99/max (ms; the
case asks p99 < 50 ms), the spread between the first and the last send, the client's CPU time
per request during the burst window (process CPU over the first 200 ms after t = 0 / N), TTFT
min/max and the run time. The GC pacer runs as in the daemon (``--no-gc-pacer``: CPython's
automatic GC). ``--profile FILE`` writes a cProfile of the last round. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import socket
import subprocess
import sys
import time
import urllib.request
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from replayer.core.clock import Anchor, now_ns  # noqa: E402
from replayer.core.events import Quiet  # noqa: E402
from replayer.core.request import PreparedRequest
from replayer.core.result import RequestResult  # noqa: E402
from replayer.http.client import Client  # noqa: E402
from replayer.payload.body import PayloadBuilder  # noqa: E402
from replayer.payload.prompts import PromptBuilder  # noqa: E402
from replayer.plan.planner import Planner  # noqa: E402
from replayer.plan.schedule import Timeline, iter_schedule  # noqa: E402
from replayer.run.gcpacer import GcPacer  # noqa: E402
from replayer.send.dispatcher import Dispatcher  # noqa: E402
from replayer.send.feed import Feed  # noqa: E402
from replayer.send.sender import LoopSender  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Batch:
    def __init__(self, n: int) -> None:
        self.timestamp_ns = np.zeros(n, dtype=np.int64)
        self.row_offset = 0
        self.session_id = None
        self._n = n

    def __len__(self) -> int:
        return self._n


async def _round(url: str, n: int, cold: bool, profile: cProfile.Profile | None, pacer: bool) -> dict:
    prompts = PromptBuilder(seed=0, block_size=512)
    payload = PayloadBuilder("m")
    timeline = Timeline(1.0)

    def prepare(sb, j):
        i = int(sb.rows[j])
        body = payload.body(prompts.prompt_json([i], 16), 50)
        return PreparedRequest(
            index=j,
            row=i,
            due_ns=timeline.due(0),
            body=body,
            input_length=16,
            output_length=50,
            prompt_len=16,
            max_tokens=50,
            trace_ns=0,
        )

    def unsent(sb, j):
        return RequestResult(row=int(sb.rows[j]))

    class _Results(Quiet):  # the run's event stream, reduced to the results
        def __init__(self, into: list) -> None:
            self.into = into

        def finished(self, res: RequestResult) -> None:
            self.into.append(res)

    async with Client(url, t0_ns=now_ns()) as c:
        if not cold:
            await c.warm_up(n)
        anchor = Anchor.at(0.3)
        c.t0_ns = anchor.t0_ns
        results: list[RequestResult] = []
        gc_pacer = GcPacer()
        if pacer:  # as the daemon composes it: collections only when nothing is due
            gc_pacer.start()
        d = Dispatcher(
            Feed(iter_schedule(lambda: [_Batch(n)]), SimpleNamespace(prepare=prepare, unsent=unsent)),
            Planner(timeline),
            LoopSender(c),
            _Results(results),
            t0_ns=anchor.t0_ns,
            on_idle=gc_pacer.idle if pacer else None,
        )
        cpu = {}

        async def cpu_window():
            await asyncio.sleep(max(0.0, (anchor.t0_ns - now_ns()) / 1e9))
            cpu["t0"] = time.process_time()
            await asyncio.sleep(0.2)
            cpu["t1"] = time.process_time()

        w = asyncio.ensure_future(cpu_window())
        if profile:
            profile.enable()
        await asyncio.wait_for(d.run(), 60)
        if profile:
            profile.disable()
        gc_pacer.stop()
        await w
        run_s = (now_ns() - anchor.t0_ns) / 1e9
    lag = np.array([r.dispatch_lag_ms for r in results])
    sent = np.array([r.sent_ns for r in results]) / 1e6
    ttft = np.array([r.ttft_ms for r in results if r.ttft_ms is not None])
    return {
        "ok": sum(r.outcome == "success" for r in results),
        "lag_p50": np.percentile(lag, 50),
        "lag_p99": np.percentile(lag, 99),
        "lag_max": lag.max(),
        "spread_ms": sent.max() - sent.min(),
        "cpu_us_per_req": (cpu["t1"] - cpu["t0"]) / n * 1e6,
        "ttft_min": ttft.min() if ttft.size else None,
        "ttft_max": ttft.max() if ttft.size else None,
        "run_s": run_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="no idle connections before t = 0")
    ap.add_argument("--profile", default=None, metavar="FILE")
    ap.add_argument(
        "--no-gc-pacer",
        action="store_true",
        help="leave CPython's automatic GC on (the daemon runs replayer.run.gcpacer; a bare Dispatcher does not)",
    )
    a = ap.parse_args()
    port = _free_port()
    sim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayer",
            "sim",
            "--port",
            str(port),
            "--ttft-base-ms",
            "2000",
            "--itl-base-ms",
            "2",
            "--prefill-us-per-token",
            "0",
            "--itl-per-running-us",
            "0",
        ],
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        import uvloop

        print(
            f"# burst of {a.n} requests at one instant ({'cold' if a.cold else 'warm'} pool), load "
            + "%.2f %.2f %.2f" % os.getloadavg()
        )
        prof = cProfile.Profile() if a.profile else None
        for k in range(a.rounds):
            r = uvloop.run(_round(url, a.n, a.cold, prof if k == a.rounds - 1 else None, not a.no_gc_pacer))
            print(
                f"round {k}: ok {r['ok']}/{a.n}  lag p50 {r['lag_p50']:.1f} p99 {r['lag_p99']:.1f} "
                f"max {r['lag_max']:.1f} ms  send spread {r['spread_ms']:.1f} ms  client CPU "
                f"{r['cpu_us_per_req']:.0f} us/req (first 200 ms)  TTFT {r['ttft_min']:.0f}..{r['ttft_max']:.0f} ms"
                f"  run {r['run_s']:.2f} s",
                flush=True,
            )
        if prof:
            prof.dump_stats(a.profile)
            print(f"profile of the last round: {a.profile}")
    finally:
        sim.terminate()
        sim.wait(10)


if __name__ == "__main__":
    main()
