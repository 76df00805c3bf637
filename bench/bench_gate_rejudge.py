"""Judge the pairs that ``bench/bench_gate.py --keep`` left in its ``--dir`` again with the
*default* gate (``require_faithful: true``, as ``replayer compare --gate`` runs in CI) and the
current code: the held and caught counts, and per pair what each guard of
``replayer/results/gatestall.py`` changed.

    .venv/bin/python bench/bench_gate_rejudge.py /tmp/bench_gate

Prints numbers, asserts nothing. A pair counts when its three runs (A, S, A2) are complete.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _line(i: int, kind: str, p: subprocess.CompletedProcess) -> str:
    if p.returncode not in (0, 7):
        return f"pair {i + 1:2d} {kind}: exit {p.returncode} {p.stderr.strip()[-200:]}"
    doc = json.loads(p.stdout)
    bad = [m["metric"] for m in doc["metrics"] if m["verdict"] == "regressed"]
    said = [
        f"{m['metric']} {m['verdict']} ({m['change']:+.0f}%)"
        for m in doc["metrics"]
        if m["reason"] and m["metric"] != "goodput" and m["change"] is not None
    ]
    t = {m["metric"]: m for m in doc["metrics"]}["ttft_p50"]
    return f"pair {i + 1:2d} {kind}: exit {p.returncode}, regressed {bad}, guarded {said}, TTFT p50 {t['change']:+.1f}%"


def main() -> None:
    d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/bench_gate"
    held = caught = n = 0
    while os.path.exists(os.path.join(d, f"A2{n:02d}", "summary.json")):
        for kind, cand in (("same", f"A2{n:02d}"), ("slower", f"S{n:02d}")):
            cmd = [sys.executable, "-m", "replayer", "compare", os.path.join(d, f"A{n:02d}"), os.path.join(d, cand)]
            p = subprocess.run([*cmd, "--gate", "--json"], capture_output=True, text=True)
            held += kind == "same" and p.returncode == 0
            caught += kind == "slower" and p.returncode == 7
            print(_line(n, kind, p), flush=True)
        n += 1
    print(f"default gate: same server held {held} of {n}; slower build caught {caught} of {n}")
    print("load %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
