"""The regression gate's false-alarm and detection rates (issue 45): how often ``replayer compare
--gate`` fails two runs of one unchanged server, and how often it catches a server whose TTFT is
25 % slower.

    .venv/bin/python bench/bench_gate.py [--pairs 20] [--slice-s 180] [--speedup 20] [--dir /tmp/bench_gate]

Prints numbers, asserts nothing. Steps:

1. The trace: the first ``--slice-s`` seconds of ``traces/mooncake_conversation_10min.parquet``
   (``replayer trace slice``), prompts and outputs scaled by ``--input-factor`` and
   ``--output-factor`` (``replayer trace scale``; short streams keep the shared host's load modest).
2. Two simulators on free 127.0.0.1 ports, with TTFT their ``--ttft-base-ms`` alone
   (``--prefill-us-per-token 0``): the baseline server (``--ttft-base-ms`` B, default 100) and the
   slower build (1.25 B: a TTFT 25 % slower).
3. ``--pairs`` times, interleaved: a run against the baseline server (A), a second one (A'), a
   run against the slower one (S), each ``replayer run TRACE --speedup S``. Then ``replayer compare
   A A' --gate`` (held is right: exit 0) and ``replayer compare A S --gate`` (regressed is right:
   exit 7), with the default gate but ``require_faithful: false`` (or ``--gate-file``; the stored
   runs judged by the default gate itself: ``bench_gate_rejudge.py``). A first run against each
   server warms it and the host (not counted).
4. Report: the pairs that held (A vs A') and that were caught (A vs S), those the gate could not
   compare (exit 2), the pairs with a run that fell behind its trace (as an overloaded host makes
   it), the metrics that raised each false alarm, TTFT p50's change and interval per pair, the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPLAYER = [sys.executable, "-m", "replayer"]
TRACE = os.path.join(ROOT, "traces", "mooncake_conversation_10min.parquet")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def _sim(ttft_ms: float) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    args = ["sim", "--port", str(port), "--ttft-base-ms", str(ttft_ms), "--prefill-us-per-token", "0"]
    proc = subprocess.Popen([*REPLAYER, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()  # noqa: S310 - 127.0.0.1 only
            return proc, url
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the simulator on {url} did not start")


def _trace(a: argparse.Namespace) -> str:
    sliced = os.path.join(a.dir, "slice.parquet")
    scaled = os.path.join(a.dir, "trace.parquet")
    subprocess.run(
        [*REPLAYER, "trace", "slice", TRACE, "--start", "0", "--end", str(a.slice_s), "-o", sliced],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        [*REPLAYER, "trace", "scale", sliced, "--input-factor", str(a.input_factor)]
        + ["--output-factor", str(a.output_factor), "-o", scaled],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return scaled


def _run(trace: str, url: str, out: str, speedup: float) -> None:
    cmd = [*REPLAYER, "run", trace, "--target", url, "--speedup", str(speedup), "--results", out]
    cmd += ["--quiet", "--admin-port", "0"]
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"run {out} failed (exit {p.returncode}): {p.stderr[-2000:]}")


def _unfaithful(*runs: str) -> bool:
    """Whether a run of the pair was not faithful to its trace (one fell behind it, most often)."""
    from replayer.results import read_summary
    from replayer.results.gateout import unfaithful

    return any(unfaithful("run", read_summary(r)) for r in runs)


def _gate(base: str, cand: str, gate_file: str) -> tuple[int, dict]:
    cmd = [*REPLAYER, "compare", base, cand, "--gate", "--json", "--gate-file", gate_file]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode == 2 and "cannot compare" in p.stderr:
        return 2, {"reason": p.stderr.strip()}
    if p.returncode not in (0, 7):
        raise SystemExit(f"compare {base} {cand}: exit {p.returncode}: {p.stderr}")
    return p.returncode, json.loads(p.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--slice-s", type=float, default=180.0, help="seconds of the trace replayed")
    ap.add_argument("--speedup", type=float, default=20.0)
    ap.add_argument("--input-factor", type=float, default=0.25)
    ap.add_argument("--output-factor", type=float, default=0.1)
    ap.add_argument("--ttft-base-ms", type=float, default=100.0, help="the baseline server's TTFT")
    ap.add_argument("--slower", type=float, default=1.25, help="the slower build's TTFT factor")
    ap.add_argument(
        "--gate-file",
        default=None,
        help="the gate's settings [default: the default gate, but require_faithful: false, so that a pair "
        "with a run the default gate refuses (exit 2: unfaithful for another reason than its own host's "
        "lateness, or later than max_client_lag_ms) is judged too]",
    )
    ap.add_argument("--dir", default="/tmp/bench_gate")
    ap.add_argument("--keep", action="store_true", help="keep the results folders")
    ap.add_argument("--log", default=None, help="append each comparison's JSON (one line each) to this file")
    a = ap.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    print(f"start: {_load()}", flush=True)
    trace = _trace(a)
    if a.gate_file is None:
        a.gate_file = os.path.join(a.dir, "gate.yaml")
        with open(a.gate_file, "w", encoding="utf-8") as f:
            f.write("require_faithful: false\n")
    sims = [_sim(a.ttft_base_ms), _sim(a.ttft_base_ms * a.slower)]
    (_, base_url), (_, slow_url) = sims
    counts = dict.fromkeys(
        ("held", "false_alarm", "caught", "missed", "same_not_comparable", "slow_not_comparable", "same_unfaithful")
        + ("slow_unfaithful", "faithful_false_alarm", "faithful_missed"),
        0,
    )
    alarms: list[tuple[int, list[str]]] = []
    t0 = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (the simulators are stopped below)
    try:
        for url in (base_url, slow_url):  # a first run warms each server and the host's caches: not counted
            _run(trace, url, os.path.join(a.dir, "warm"), a.speedup)
            shutil.rmtree(os.path.join(a.dir, "warm"))
        for i in range(a.pairs):
            runs = {k: os.path.join(a.dir, f"{k}{i:02d}") for k in ("A", "A2", "S")}
            _run(trace, base_url, runs["A"], a.speedup)
            _run(trace, slow_url, runs["S"], a.speedup)
            _run(trace, base_url, runs["A2"], a.speedup)
            rc_same, same = _gate(runs["A"], runs["A2"], a.gate_file)
            rc_slow, slow = _gate(runs["A"], runs["S"], a.gate_file)
            if a.log:
                with open(a.log, "a", encoding="utf-8") as f:
                    for kind, doc in (("same", same), ("slower", slow)):
                        f.write(json.dumps({"pair": i, "kind": kind, **doc}) + "\n")
            counts[{0: "held", 7: "false_alarm", 2: "same_not_comparable"}[rc_same]] += 1
            counts[{7: "caught", 0: "missed", 2: "slow_not_comparable"}[rc_slow]] += 1
            late_same, late_slow = _unfaithful(runs["A"], runs["A2"]), _unfaithful(runs["A"], runs["S"])
            counts["same_unfaithful"] += late_same
            counts["slow_unfaithful"] += late_slow
            counts["faithful_false_alarm"] += rc_same == 7 and not late_same
            counts["faithful_missed"] += rc_slow == 0 and not late_slow
            bad = [m["metric"] for m in same.get("metrics", []) if m["verdict"] == "regressed"]
            if bad:
                alarms.append((i, bad))
            late = " [a run fell behind its trace]"
            print(
                f"pair {i + 1:2d}: same server {_said(rc_same, same)}{late if late_same else ''}; "
                f"slower build {_said(rc_slow, slow)}{late if late_slow else ''}; {_load()}",
                flush=True,
            )
            if not a.keep:
                for path in runs.values():
                    shutil.rmtree(path, ignore_errors=True)
    finally:
        for proc, _ in sims:
            proc.terminate()
            proc.wait(timeout=30)
    n = a.pairs
    print(
        f"\nsame server:  {counts['held']} of {n} pairs held, {counts['false_alarm']} false alarms, "
        f"{counts['same_not_comparable']} not comparable (a run fell behind its trace)"
    )
    print(
        f"slower build: {counts['caught']} of {n} pairs caught ({100 * (a.slower - 1):.0f}% slower TTFT), "
        f"{counts['missed']} missed, {counts['slow_not_comparable']} not comparable"
    )
    print(
        f"pairs with a run that fell behind its trace (dispatch lag p99 > 25 ms: the default gate judges them "
        f"without their tails, gatestall): {counts['same_unfaithful']} same-server, {counts['slow_unfaithful']} slower-build; among the "
        f"others {counts['faithful_false_alarm']} false alarms, {counts['faithful_missed']} missed"
    )
    for i, bad in alarms:
        print(f"  false alarm in pair {i + 1}: {', '.join(bad)}")
    print(f"time: {time.monotonic() - t0:.0f} s; end: {_load()}")


def _said(rc: int, doc: dict) -> str:
    """One comparison in a few words: its verdict and TTFT p50's change and interval."""
    if rc == 2:
        return "not comparable (" + doc["reason"].split("cannot compare: ", 1)[-1] + ")"
    m = {m["metric"]: m for m in doc["metrics"]}["ttft_p50"]
    bad = [x["metric"] for x in doc["metrics"] if x["verdict"] == "regressed"]
    ci = m["interval"] or [float("nan")] * 2
    return f"{doc['verdict']}{' ' + ','.join(bad) if bad else ''} (TTFT p50 {m['change']:+.1f}% [{ci[0]:+.1f}, {ci[1]:+.1f}])"


if __name__ == "__main__":
    main()
