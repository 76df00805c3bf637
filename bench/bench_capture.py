"""What `replayer record` costs on W1: TTFT/ITL it adds, its CPU per 1k requests, its memory.

Runs `bench/fidelity/run.sh W1` (the neutral harness server in ../shared/bench/fidelity; first 600 s
of the Mooncake conversation trace at 10x: 1,750 requests, ~120 streams) directly and through the
proxy (`TOOL=record`), interleaved (direct, proxy, direct, proxy, ...), back to back on the same
machine, and prints per run and per mode:

* the client's TTFT p99 and its error against the server's truth (`measurement_err.ttft_p99`:
  client p99 - server p99; through the proxy it includes what the proxy adds), the client's ITL
  p99 and mean (the server paces tokens every 10 ms, so ITL above 10 ms is delay on the way), the
  server-side dispatch error p99 (arrival at the server vs the trace: the proxy's delay shows there);
* "added by the proxy" = the proxy runs' mean minus the direct runs' mean of each figure;
* the proxy's CPU seconds per 1k requests (user + system of its process) and peak / end RSS;
* the replayer's own dispatch lag p99 (late sends are the client's or the host's, not the proxy's);
* the time the proxy held requests and responses by its own kernel stamps
  (``replayer_capture_forward_delay_seconds``, read from its /metrics at the end of each run):
  what it adds itself, but for the loopback hop, apart from what it costs the host's other processes.

    .venv/bin/python bench/bench_capture.py [--pairs 2] [--work DIR] [--record-args "--poll-interval 0"]
        [--record-args=--stamp-responses] [--proxy-nice -10]
        [--modes direct,proxy,proxy-nopoll,proxy-baseline] [--baseline DIR]

``--modes``: the runs of each round, in order: ``direct``, ``proxy`` (with ``--record-args``),
``proxy-nopoll`` (the same with ``--poll-interval 0``: woken per streamed event),
``proxy-baseline`` (the proxy of the checkout ``--baseline DIR``, e.g. a ``git worktree`` of the
commit before a change, through ``PYTHONPATH``: before and after interleaved in one session; the
client is that checkout's too).
``--speedup S``: W1 at another speed-up (5: ~60 streams, half the events per second).
``--pin``: on a host of 2 or more CPUs, the harness (its server and replayer) runs on CPU 0 and the
proxy on CPU 1 in every mode, as a sidecar with a core of its own (the proxy then competes with no
one, and the direct runs get the same single CPU as the proxy runs' client and server).
The host is shared: also prints per run the load average, steal, and the CPU seconds the harness
saw the whole machine and other processes (``foreign``) use.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def steal_ticks() -> int:
    with open("/proc/stat") as f:
        return int(f.readline().split()[8])


def forward_delays(path: str) -> dict:
    """From the proxy's /metrics (``proxy_metrics.txt``): per direction of
    ``replayer_capture_forward_delay_seconds``, the count, the mean, the share within 1 ms, and
    p50/p99 as the upper bound of the bucket they fall in."""
    from prometheus_client.parser import text_string_to_metric_families

    if not os.path.exists(path):
        return {}
    fam = next(
        (
            f
            for f in text_string_to_metric_families(open(path).read())
            if f.name == "replayer_capture_forward_delay_seconds"
        ),
        None,
    )
    if fam is None:
        return {}
    out = {}
    for d in ("request", "response"):
        buckets = sorted(
            (float(s.labels["le"]), s.value)
            for s in fam.samples
            if s.labels.get("direction") == d and s.name.endswith("_bucket")
        )
        total = next(s.value for s in fam.samples if s.labels.get("direction") == d and s.name.endswith("_count"))
        ssum = next(s.value for s in fam.samples if s.labels.get("direction") == d and s.name.endswith("_sum"))
        if not total:
            continue

        p50, p99 = (next(le for le, n in buckets if n >= p * total) * 1e3 for p in (0.5, 0.99))
        out[d] = {
            "count": int(total),
            "mean_ms": ssum / total * 1e3,
            "within_1ms": dict(buckets)[0.001] / total,
            "p50_le_ms": p50,
            "p99_le_ms": p99,
        }
    return out


def one_run(
    mode: str, work: str, record_args: str = "", extra_env: dict | None = None, pin: bool = False, speedup: float = 10
) -> dict:
    import socket

    with socket.socket() as sk:  # a free port for the harness server (another run may hold 9100)
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    proxy = mode != "direct"
    if mode == "proxy-nopoll":
        record_args = f"{record_args} --poll-interval 0"
    env = {
        **os.environ,
        "TOOL": "record" if proxy else "replayer",
        "PORT": str(port),
        "RECORD_ARGS": record_args,
        "SPEEDUP": f"{speedup:g}",
        **({"RECORD_CPUS": "1"} if pin else {}),
        **(extra_env or {}),
    }
    load0, st0 = os.getloadavg()[0], steal_ticks()
    subprocess.run(
        [*(["taskset", "-c", "0"] if pin else []), "bash", os.path.join(ROOT, "bench/fidelity/run.sh"), "W1", work],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    load1, st1 = os.getloadavg()[0], steal_ticks()
    run = os.path.join(work, f"run_w1{'' if speedup == 10 else f'_s{speedup:g}'}_{env['TOOL']}")
    score = json.load(open(os.path.join(run, "score.json")))
    summary = json.load(open(os.path.join(run, "tool", "results", "summary.json")))
    cost = json.load(open(os.path.join(run, "client_cost.json")))
    out = {
        "mode": mode,
        "pinned": pin,
        "speedup": speedup,
        "ttft_p99_ms": summary["p99_ttft_ms"],
        "ttft_p99_err_ms": score["measurement_err"]["ttft_p99"],
        "itl_p99_ms": summary["p99_itl_ms"],
        "itl_mean_ms": summary["mean_itl_ms"],
        "dispatch_p99_ms": score["dispatch"]["median_aligned_p99_abs_ms"],
        "completed": summary["completed"],
        "load_avg": f"{load0:.1f}->{load1:.1f}",
        "steal_s": (st1 - st0) / os.sysconf("SC_CLK_TCK"),
        "replayer_dispatch_lag_p99_ms": summary.get("dispatch_lag_p99_ms"),
        "machine_busy_cpu_s": cost.get("machine_busy_cpu_s"),
        "foreign_cpu_s": cost.get("foreign_cpu_s"),
        "wall_s": cost.get("wall_s"),
    }
    if proxy:
        p = json.load(open(os.path.join(run, "tool", "proxy.json")))
        out.update(
            record_args=record_args,
            proxy_nice=(extra_env or {}).get("RECORD_NICE"),
            proxy_cpu_s_per_1k=p["proxy_cpu_s"] / summary["completed"] * 1000,
            proxy_system_share=p["proxy_system_s"] / p["proxy_cpu_s"] if p["proxy_cpu_s"] else None,
            proxy_cpu_wait_s=p.get("proxy_cpu_wait_s"),
            proxy_peak_rss_mb=p["proxy_peak_rss_mb"],
            proxy_end_rss_mb=p["proxy_end_rss_mb"],
            rows_captured=p["rows_captured"],
            held=forward_delays(os.path.join(run, "tool", "proxy_metrics.txt")),
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2, help="direct + proxy pairs [default: 2]")
    ap.add_argument("--work", default=None, help="work folder [default: a new temporary one]")
    ap.add_argument("--record-args", default="", help='options for `replayer record` (e.g. "--poll-interval 0")')
    ap.add_argument("--modes", default="direct,proxy", help="runs of each round [default: direct,proxy]")
    ap.add_argument(
        "--speedup",
        type=float,
        default=10,
        help="W1's speed-up [default: 10, the issue's]; lower = fewer streams, a host with CPU to spare",
    )
    ap.add_argument("--baseline", default=None, help="checkout whose proxy the proxy-baseline mode runs")
    ap.add_argument(
        "--proxy-nice",
        type=int,
        default=None,
        metavar="N",
        help="run the proxy at niceness N (e.g. -10: scheduled ahead of the client and the server)",
    )
    ap.add_argument("--pin", action="store_true", help="harness on CPU 0, proxy on CPU 1 (a core of its own)")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="bench-capture-")
    runs = []
    modes = args.modes.split(",")
    if "proxy-baseline" in modes and not args.baseline:
        ap.error("the proxy-baseline mode needs --baseline DIR")
    for _i in range(args.pairs):
        for mode in modes:
            env = {"PYTHONPATH": os.path.abspath(args.baseline)} if mode == "proxy-baseline" else {}
            if args.proxy_nice is not None:
                env["RECORD_NICE"] = str(args.proxy_nice)
            r = one_run(mode, work, args.record_args, extra_env=env, pin=args.pin, speedup=args.speedup)
            runs.append(r)
            print(json.dumps(r), flush=True)
    keys = ("ttft_p99_ms", "ttft_p99_err_ms", "itl_p99_ms", "itl_mean_ms", "dispatch_p99_ms")

    def mean(mode: str, k: str) -> float:
        v = [r[k] for r in runs if r["mode"] == mode and r.get(k) is not None]
        return sum(v) / len(v) if v else float("nan")

    for pm in [m for m in modes if m != "direct"]:
        print(f"\nadded by {pm} (mean of its runs - mean of direct runs), ms:")
        for k in keys:
            print(
                f"  {k:18s} direct {mean('direct', k):8.2f}  {pm} {mean(pm, k):8.2f}  "
                f"added {mean(pm, k) - mean('direct', k):+8.2f}"
            )
    px = [r for r in runs if r["mode"] != "direct"]
    print("proxy CPU s per 1k requests: " + ", ".join(f"{r['proxy_cpu_s_per_1k']:.2f}" for r in px))
    print(
        "proxy's main thread runnable but waiting for a CPU, s per run: "
        + ", ".join(f"{r['proxy_cpu_wait_s']:.1f}" for r in px if r.get("proxy_cpu_wait_s") is not None)
    )
    print(
        "proxy peak RSS MB: "
        + ", ".join(f"{r['proxy_peak_rss_mb']:.0f}" for r in px)
        + "; at the end: "
        + ", ".join(f"{r['proxy_end_rss_mb']:.0f}" for r in px)
    )
    print("rows captured: " + ", ".join(str(r["rows_captured"]) for r in px))
    for d in ("request", "response"):
        h = [r["held"][d] for r in px if d in r.get("held", {})]
        if h:
            print(
                f"held in the proxy ({d}: kernel arrival to write on), per run: "
                + "; ".join(
                    f"{x['count']} obs, mean {x['mean_ms']:.3f} ms, {x['within_1ms']:.2%} within 1 ms, "
                    f"p50 <= {x['p50_le_ms']:g} ms, p99 <= {x['p99_le_ms']:g} ms"
                    for x in h
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
