"""Start-up is not lateness: time spent opening the connection pool is not charged to requests."""

import subprocess
import sys

from replayer.recorder import read_results

# The daemon as a process whose pool opens slowly, as against a target with a small listen backlog
# (SYNs dropped and retried after 1 s): the real warm-up, then a pause of argv[1] seconds. It
# prints how long the whole warm-up took, measured on the replayer's clock.
SLOW_POOL = """
import asyncio, sys
from replayer import client
from replayer.clock import now_ns
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
    p = subprocess.run([sys.executable, "-c", SLOW_POOL, "1.5", "run", str(trace), "--target", url,
                        "--speedup", "10", "--warm-connections", "64", "--results", str(res),
                        "--admin-port", "0", "--quiet"], capture_output=True, text=True, timeout=120)
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
