"""One point of ``replayer sweep`` (``replayer.run.sweep``): its run (a child ``replayer run``
with its own results folder and log), its record in ``sweep.json`` read from that folder (the
offered load, the steady window and the judgement: ``replayer.results.steady``), the target's
prefix cache reset before it, and its progress line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pyarrow.compute as pc

from replayer.record.folder import read_file
from replayer.results.steady import COLUMNS, judge_point, steady_window
from replayer.results.summary import read_summary

#: summary.json keys copied into each point of sweep.json (vllm bench serve's names)
POINT_KEYS = (
    "run_id",
    "scheduled",
    "sent",
    "completed",
    "failed",
    "duration",
    "request_throughput",
    "request_goodput",
    "output_token_goodput",
    "slo_attainment",
    "slo_met",
    "slo_missed",
    "slo_unknown",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
    "dispatch_lag_p50_ms",
    "dispatch_lag_p99_ms",
    "max_concurrent_requests",
    "expected_prefix_hit_tokens",
    "server_prefix_cache_hit_tokens",
)


class SweepError(RuntimeError):
    """The sweep cannot start or go on (bad flags, a target without ``/reset_prefix_cache``)."""


def run_point(args: list[str], env: dict[str, str], folder: str, started: list[subprocess.Popen]) -> int:
    """Run one point's ``replayer run`` (``args``: its flags) in a session of its own, its output
    in ``folder/run.log``; returns its exit code. The process is in ``started`` while it runs (the
    sweep forwards its stop signals to it)."""
    with open(os.path.join(folder, "run.log"), "ab") as log:
        p = subprocess.Popen(
            [sys.executable, "-m", "replayer", "run", *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        started[:] = [p]
        return p.wait()


def point_rows(folder: str) -> dict[str, list]:
    """The columns ``replayer.results.steady.steady_window`` reads (``steady.COLUMNS``), of every
    results file of a point's folder (a ``--workers`` point's in its worker folders), as lists."""
    from replayer.results.reportdata import report_files

    cols: dict[str, list] = {c: [] for c in COLUMNS}
    for f in report_files(folder):
        t = read_file(f, list(COLUMNS))
        if t is None or not t.num_rows:
            continue
        t = t.filter(pc.is_valid(t.column("due_ns")))
        for c in COLUMNS:
            cols[c] += t.column(c).to_pylist()
    return cols


def offered_rps(due_ns: list[int]) -> float | None:
    """The load a point offered, requests/s: (n - 1) / the span of its n due times; None for
    fewer than 2 requests or a span of 0."""
    if len(due_ns) < 2 or max(due_ns) <= min(due_ns):
        return None
    return (len(due_ns) - 1) / ((max(due_ns) - min(due_ns)) / 1e9)


def reset_prefix_cache(target: str, api_key: str | None, timeout_s: float) -> None:
    """``POST {target}/reset_prefix_cache``, retried while the target does not answer (up to
    ``timeout_s``). Raises SweepError when it answers anything but 200 (vLLM serves the endpoint
    only with ``VLLM_SERVER_DEV_MODE=1``) or never answers."""
    url = target.rstrip("/") + "/reset_prefix_cache"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, data=b"", headers=headers, method="POST"), timeout=30
            ) as r:
                r.read()
                return
        except urllib.error.HTTPError as e:
            raise SweepError(
                f"--prefix-cache reset: POST {url} answered HTTP {e.code} (vLLM serves it with "
                "VLLM_SERVER_DEV_MODE=1); --prefix-cache salt needs nothing of the server"
            ) from None
        except OSError as e:
            if time.monotonic() >= deadline:
                raise SweepError(f"--prefix-cache reset: POST {url}: {e}") from None
            time.sleep(0.2)


def short_window(w: dict) -> str:
    """Why a too-short window is: what is left of the span against the median E2E."""
    e2e = (w["median_e2el_ms"] or 0) / 1e3
    return f"{max(w['window_s'], 0):.2f} s left of a {w['span_s']:.2f} s offered span, median E2E {e2e:.2f} s"


def window_text(w: dict | None) -> str:
    """A point's steady window in words: its bounds, offered and achieved rates, attainment and
    goodput (``replayer.results.steady.steady_window``'s dict; None: fewer than 2 requests)."""

    def rate(v) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    if w is None:
        return "steady window: none (fewer than 2 requests)"
    if w["too_short"]:
        return f"steady window: too short ({short_window(w)})"
    bounds = f"{w['start_s']:.2f}-{w['end_s']:.2f} s of {w['span_s']:.2f} s"
    att = w["slo_attainment"]
    return (
        f"steady window {bounds}: offered {rate(w['offered_rps'])}, achieved {rate(w['achieved_rps'])} req/s, "
        f"attainment {'n/a' if att is None else f'{att:.1%}'} ({w['met']} of {w['judged']}), "
        f"goodput {rate(w['request_goodput'])} req/s"
    )


def point_line(i: int, total: int, p: dict) -> str:
    """The progress line of point ``i`` (1-based) of ``total``: the offered load, the steady
    window (``window_text``), the whole run's latencies and the status."""

    def ms(key: str) -> str:
        v = p.get(key)
        return "n/a" if v is None else f"{v:.0f}" if v >= 10 else f"{v:.1f}"

    if p["status"] == "error":
        return f"sweep point {i}/{total}: speed-up {p['speedup']:g}x: error ({p['why']})"
    att = p.get("slo_attainment")
    offered = p.get("offered_rps")
    return (
        f"sweep point {i}/{total}: speed-up {p['speedup']:g}x, offered {'n/a' if offered is None else f'{offered:.2f}'} "
        f"req/s; {window_text(p.get('steady_window'))}; whole run: attainment "
        f"{'n/a' if att is None else f'{att:.1%}'}, "
        f"TTFT p50/p99 {ms('median_ttft_ms')}/{ms('p99_ttft_ms')} ms, "
        f"TPOT p50/p99 {ms('median_tpot_ms')}/{ms('p99_tpot_ms')} ms, E2E p50/p99 "
        f"{ms('median_e2el_ms')}/{ms('p99_e2el_ms')} ms, dispatch lag p99 {ms('dispatch_lag_p99_ms')} ms: "
        f"{p['status']}" + ("" if p["status"] == "held" else f" ({p['why']})")
    )


def point_record(
    index: int, speedup: float, folder: str, seed: int, exit_code: int, min_attainment: float, max_lag_ms: float
) -> dict:
    """One point of ``sweep.json``, from its run's folder: its settings, offered load (whole
    span), achieved rate and steady window (``replayer.results.steady``), the ``POINT_KEYS`` and
    ``slo_attainment_<bound>`` of its ``summary.json``, and its judgement (``judge_point``:
    ``status``, ``why``, ``replayer_behind``)."""
    summary = read_summary(folder) or None
    rows = point_rows(folder) if summary else {c: [] for c in COLUMNS}
    window = steady_window(*(rows[c] for c in COLUMNS))
    status, why = judge_point(summary, window, min_attainment, max_lag_ms)
    return {
        "index": index,
        "speedup": speedup,
        "results": os.path.basename(folder),
        "seed": seed,
        "exit_code": exit_code,
        "offered_rps": offered_rps(rows["due_ns"]),
        "achieved_rps": window["achieved_rps"] if window else None,
        "steady_window": window,
        **{key: (summary or {}).get(key) for key in POINT_KEYS},
        **{key: v for key, v in (summary or {}).items() if key.startswith("slo_attainment_")},
        "status": status,
        "why": why,
        "replayer_behind": status == "replayer_behind",
    }
