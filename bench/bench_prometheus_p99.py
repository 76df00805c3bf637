"""Prometheus's p99 against the summary's exact one, on a real replay (issue 46).

    .venv/bin/python bench/bench_prometheus_p99.py [TRACE] [SPEEDUP]

Replays TRACE (default: the committed 10-minute Mooncake slice, W1) at SPEEDUP (10) against the
embedded simulator while Debian's ``prometheus`` scrapes the admin port every second; after the
run (the linger serves the last scrape) it asks Prometheus for ``histogram_quantile(0.99, ...)``
of TTFT, ITL, TPOT and E2E over the whole run and prints each beside the summary's exact p99 and
their relative difference. Needs ``prometheus`` on PATH. Prints numbers, asserts nothing.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(base: str, expr: str) -> list:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())["data"]["result"]


def main() -> None:
    trace = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "traces" / "mooncake_conversation_10min.parquet")
    speedup = sys.argv[2] if len(sys.argv) > 2 else "10"
    prom_bin = shutil.which("prometheus")
    if prom_bin is None:
        sys.exit("needs prometheus (apt-get install prometheus)")
    work = Path(tempfile.mkdtemp(prefix="p99-"))
    admin, pport = _port(), _port()
    cfg = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "replayer", "static_configs": [{"targets": [f"127.0.0.1:{admin}"]}]}],
    }
    (work / "prometheus.yml").write_text(json.dumps(cfg))
    prom = subprocess.Popen(
        [
            prom_bin,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{pport}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{pport}"
    try:
        time.sleep(3)
        run = [sys.executable, "-m", "replayer", "run", trace, "--speedup", speedup, "--run-id", "p99"]
        run += ["--admin-port", str(admin), "--results", str(work / "res"), "--quiet"]
        t0 = time.monotonic()
        subprocess.run(run, check=True, stdout=subprocess.DEVNULL)
        print(f"replay of {trace} at {speedup}x: {time.monotonic() - t0:.0f} s")
        summary = json.loads((work / "res" / "summary.json").read_text())
        print(f"{'metric':8} {'summary p99 ms':>15} {'Prometheus p99 ms':>18} {'difference':>11}")
        for name, metric, field in (
            ("TTFT", "replayer_ttft_seconds", "p99_ttft_ms"),
            ("ITL", "replayer_itl_seconds", "p99_itl_ms"),
            ("TPOT", "replayer_tpot_seconds", "p99_tpot_ms"),
            ("E2E", "replayer_e2e_latency_seconds", "p99_e2el_ms"),
        ):
            expr = f'histogram_quantile(0.99, sum by (le) (last_over_time({metric}_bucket{{run_id="p99"}}[10m])))'
            got = float(_query(base, expr)[0]["value"][1]) * 1e3
            exact = summary[field]
            print(f"{name:8} {exact:15.2f} {got:18.2f} {100 * (got / exact - 1):10.2f}%")
    finally:
        prom.terminate()
        prom.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
