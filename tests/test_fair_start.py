"""Start-up is not lateness: time spent opening the connection pool is not charged to requests."""

import subprocess
import sys

from replayer.record import read_results

# The daemon as a process whose pool opens slowly, as against a target with a small listen backlog
# (SYNs dropped and retried after 1 s): the real warm-up, then a pause of argv[1] seconds. It
# prints how long the whole warm-up took, measured on the replayer's clock.
SLOW_POOL = """
import asyncio, sys
from replayer.http import client
from replayer.core.clock import now_ns
real = client.Client.warm_up
pause_s = float(sys.argv.pop(1))

async def slow(self, n):
    t = now_ns()
    opened = await real(self, n)
    await asyncio.sleep(pause_s)
    print(f"WARM-UP-S {(now_ns() - t) / 1e9:.6f}", file=sys.stderr, flush=True)
    return opened

client.Client.warm_up = slow
from replayer.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_slow_pool_opening_is_not_charged_as_dispatch_lag(tmp_path, mooncake_slice, sim_process):
    trace = mooncake_slice(5)
    url, _ = sim_process("--itl-base-ms", "1")
    res = tmp_path / "r"
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            SLOW_POOL,
            "1.5",
            "run",
            str(trace),
            "--target",
            url,
            "--speedup",
            "10",
            "--warm-connections",
            "64",
            "--results",
            str(res),
            "--admin-port",
            "0",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    warm_ms = 1e3 * float(next(ln.split()[1] for ln in p.stderr.splitlines() if ln.startswith("WARM-UP-S")))
    assert warm_ms >= 1500
    rows = sorted(read_results(str(res)).to_pylist(), key=lambda r: r["due_ns"])
    assert rows and all(r["outcome"] == "success" for r in rows)
    # anchored once the pool was open: the first requests are not late by the warm-up (before,
    # every one was ~1.5 s late); a third of it leaves room for a busy machine
    lags = [r["dispatch_lag_ms"] for r in rows]
    assert max(lags[:5]) < warm_ms / 3 and max(lags) < warm_ms / 3, (warm_ms, lags[:5])
    assert "keep-alive connections ahead of the first request in" in p.stderr


def test_the_first_lead_window_is_built_before_the_anchor(tmp_path):
    """``prebuild``: the requests due within the lead window of the start are built before the
    run is anchored (pure: no event loop) and handed out by ``prepare`` in order, the same
    requests as built on the way; the rest are built as they come."""
    import json

    import numpy as np

    from replayer.payload import PayloadBuilder, Prompts, RequestFactory
    from replayer.plan import Timeline
    from replayer.plan.schedule import ScheduleBatch
    from replayer.trace import read_trace

    p = tmp_path / "t.jsonl"
    p.write_text(
        "".join(
            json.dumps({"timestamp": 100 * k, "input_length": 600 + k, "output_length": 3, "hash_ids": [k % 3, 10 + k]})
            + "\n"
            for k in range(10)
        )
    )
    t = read_trace(p)
    sb = ScheduleBatch(
        loop=0,
        batch=t,
        idx=np.arange(10),
        trace_ns=np.arange(10, dtype=np.int64) * 100_000_000,
        rows=np.arange(10),
        first_index=0,
    )

    def factory(speedup: float) -> RequestFactory:
        return RequestFactory(Prompts(512, seed=4), PayloadBuilder("m"), Timeline(speedup), run_id="r")

    ahead = factory(2.0)
    assert ahead.prebuild(sb, lead_ns=200_000_000) == 5  # due 0, 50, 100, 150, 200 ms at 2x
    built = dict(ahead._prebuilt[1])
    reqs = [ahead.prepare(sb, j) for j in range(10)]
    assert all(reqs[j] is built[j] for j in range(5)) and ahead._prebuilt is None
    fresh = factory(2.0)
    plain = [fresh.prepare(sb, j) for j in range(10)]
    assert [(r.body, r.due_ns, r.expected_hits, r.x_request_id) for r in reqs] == [
        (r.body, r.due_ns, r.expected_hits, r.x_request_id) for r in plain
    ]
    assert factory(1.0).prebuild(None, lead_ns=10**9) == 0
