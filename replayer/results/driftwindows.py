"""The drift verdict's windows (``results/drift``): the results folded by window of trace position,
(loop, position), each window's latency sketches, counts and offered load, and the target's
scraped signals per window; ``series`` gives one row per window in time order."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replayer.core.result import itl_samples
from replayer.core.stats import Stat

#: the latencies windowed, and their quantiles
LATENCIES = ("ttft", "itl", "tpot", "e2e")
QUANTILES = (10, 50, 90, 99)
#: the server's own TTFT (``--server-timings``: vLLM's, from scheduling), windowed beside the
#: client's: a drift in it is the server's, not the network's or the client host's
SERVER = ("server_ttft",)
#: each windowed statistic's results column (ITL: the lists, ``itl_samples``)
_COLUMN_OF = {
    "ttft": "ttft_ms",
    "tpot": "tpot_ms",
    "e2e": "e2e_ms",
    "dispatch_lag": "dispatch_lag_ms",
    "server_ttft": "server_time_to_first_token_ms",
}
#: results columns the fold reads
COLUMNS = (
    "loop",
    "due_ns",
    "sent_ns",
    "outcome",
    "warmup",
    "input_length",
    "output_length",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "dispatch_lag_ms",
    "server_time_to_first_token_ms",
    "itl_ms",
    "itl_counts",
    "slo_met",
)
#: the target's series: window field -> (sample names, how a window folds them)
SIGNALS: dict[str, tuple[tuple[str, ...], str]] = {
    "kv_cache_usage": (("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), "mean"),
    "requests_waiting": (("vllm:num_requests_waiting",), "mean"),
    "preemptions_per_s": (("vllm:num_preemptions_total",), "rate"),
    "process_memory_bytes": (("process_resident_memory_bytes",), "mean"),
}


def loop_origins(batches: Iterable[pa.RecordBatch]) -> dict[int, int]:
    """Each loop's first due time (ns on the run's axis), from batches of ``loop`` and ``due_ns``."""
    out: dict[int, int] = {}
    for b in batches:
        if not b.num_rows:
            continue
        loops = b.column("loop").to_numpy(zero_copy_only=False)
        due = pc.fill_null(b.column("due_ns"), 2**62).to_numpy(zero_copy_only=False)
        for lp in np.unique(loops):
            m = int(due[loops == lp].min())
            out[int(lp)] = min(out.get(int(lp), m), m)
    return out


#: a window's counts (``in_tokens``/``out_tokens``: the prompt and output tokens of the requests
#: due in it, the trace's lengths)
WINDOW_COUNTS = ("due", "sent", "completed", "failed", "met", "e2e_sum", "in_tokens", "out_tokens")
#: the offered load a window's values are adjusted for without loops (the trace's, per second)
OFFERED = ("offered_rps", "offered_input_tps", "offered_output_tps")


class _Window:
    __slots__ = ("stats", "n")

    def __init__(self) -> None:
        # (sketched: a days-long soak has thousands of windows, their values would not fit)
        self.stats = {m: Stat(exact=False) for m in (*LATENCIES, *SERVER, "dispatch_lag")}
        self.n: dict[str, float] = dict.fromkeys(WINDOW_COUNTS, 0)


class DriftFold:
    """Windows folded from results batches (``COLUMNS``) on one time axis; ``origins`` from
    ``loop_origins`` over the same batches."""

    def __init__(self, window_s: float, origins: dict[int, int]) -> None:
        self.window_ns = max(1, int(window_s * 1e9))
        self.window_s = window_s
        self.origins = origins
        self.windows: dict[tuple[int, int], _Window] = {}
        self.signals: dict[tuple[int, int], dict[str, float]] = {}

    def _keys(self, loops: np.ndarray, t_ns: np.ndarray) -> np.ndarray:
        org = np.array([self.origins.get(int(lp), 0) for lp in loops], dtype=np.int64) if loops.size else loops
        return (t_ns - org) // self.window_ns

    def add(self, b: pa.RecordBatch | pa.Table) -> None:
        if "warmup" in b.schema.names:
            b = b.filter(pc.invert(pc.fill_null(b.column("warmup"), False)))
        if not b.num_rows:
            return
        loops = b.column("loop").to_numpy(zero_copy_only=False).astype(np.int64)
        pos = self._keys(loops, pc.fill_null(b.column("due_ns"), 0).to_numpy(zero_copy_only=False))
        outcome = b.column("outcome")
        sent = b.column("sent_ns").is_valid().to_numpy(zero_copy_only=False)
        ok = pc.equal(outcome, "success").to_numpy(zero_copy_only=False)
        failed = pc.equal(outcome, "failed").to_numpy(zero_copy_only=False)
        met = (
            pc.fill_null(b.column("slo_met"), False).to_numpy(zero_copy_only=False)
            if "slo_met" in b.schema.names
            else None
        )
        lat = {
            m: pc.cast(b.column(col), pa.float64()).to_numpy(zero_copy_only=False)
            for m, col in _COLUMN_OF.items()
            if col in b.schema.names
        }
        lengths = {
            k: pc.cast(b.column(col), pa.float64()).to_numpy(zero_copy_only=False)
            for k, col in (("in_tokens", "input_length"), ("out_tokens", "output_length"))
            if col in b.schema.names
        }
        pairs = np.unique(np.stack([loops, pos]), axis=1)
        for lp, p in pairs.T:
            sel = (loops == lp) & (pos == p)
            w = self.windows.setdefault((int(lp), int(p)), _Window())
            good = sel & ok
            for m, v in lat.items():
                w.stats[m].add(v[sel & sent] if m == "dispatch_lag" else v[good])
            w.stats["itl"].add(itl_samples(b, good))
            n = w.n
            n["due"] += int(sel.sum())
            n["sent"] += int((sel & sent).sum())
            n["completed"] += int(good.sum())
            n["failed"] += int((sel & failed).sum())
            n["e2e_sum"] += float(np.nansum(lat["e2e"][sel & sent]))
            for k in ("in_tokens", "out_tokens"):  # (unknown where the results have no lengths)
                n[k] += float(np.nansum(lengths[k][sel])) if k in lengths else float("nan")
            if met is not None:
                n["met"] += int((good & met).sum())

    def add_samples(self, t: pa.Table) -> None:
        """The target's scraped series (``replayer.observe.target_samples`` rows, ``t_ns`` on the
        run's axis): each window's mean of the gauges, the counters' increase per second."""
        if not self.origins:
            return
        starts = sorted(self.origins.items(), key=lambda kv: kv[1])
        t_ns = t.column("t_ns").to_numpy(zero_copy_only=False)
        names = t.column("metric")
        for field, (accepted, how) in SIGNALS.items():
            mask = pc.is_in(names, pa.array(list(accepted))).to_numpy(zero_copy_only=False)
            if not mask.any():
                continue
            tt, vv = t_ns[mask], t.column("value").to_numpy(zero_copy_only=False)[mask]
            idx = np.searchsorted([s for _, s in starts], tt, side="right") - 1
            ok = idx >= 0
            loops = np.array([starts[i][0] for i in idx[ok]], dtype=np.int64)
            pos = self._keys(loops, tt[ok])
            for lp, p in np.unique(np.stack([loops, pos]), axis=1).T:
                sel = (loops == lp) & (pos == p)
                v, ts = vv[ok][sel], tt[ok][sel]
                if how == "mean":
                    val = float(v.mean())
                else:  # a counter: its increase over the window's span (sum over series: vLLM's per engine)
                    span = (ts.max() - ts.min()) / 1e9
                    val = float((v.max() - v.min()) / span) if span > 0 else float("nan")
                self.signals.setdefault((int(lp), int(p)), {})[field] = val

    def series(self) -> list[dict[str, Any]]:
        """One dict per window, in time order: ``loop``, ``position``, ``t_s`` (its middle, s on the
        run's axis), the latency quantiles, the rates, and the target's signals (absent: null)."""
        out = []
        for (lp, p), w in sorted(self.windows.items(), key=lambda kv: (self.origins.get(kv[0][0], 0), kv[0][1])):
            n, ws = w.n, self.window_s
            row: dict[str, Any] = {"loop": lp, "position": p}
            row["t_s"] = (self.origins.get(lp, 0) + (p + 0.5) * self.window_ns) / 1e9
            for m in (*LATENCIES, *SERVER):
                for q in QUANTILES:
                    row[f"{m}_p{q}_ms"] = w.stats[m].percentile(q)
            ended = n["completed"] + n["failed"]
            row["error_rate"] = n["failed"] / ended if ended else None
            row["goodput_rps"] = n["met"] / ws
            row["achieved_rps"] = n["sent"] / ws
            row["offered_rps"] = n["due"] / ws
            for field, k in (("offered_input_tps", "in_tokens"), ("offered_output_tps", "out_tokens")):
                v = float(n.get(k, float("nan")))  # (NaN: a digest's window written before its lengths)
                row[field] = None if np.isnan(v) else v / ws
            row["in_flight"] = n["e2e_sum"] / 1e3 / ws
            row["requests"] = n["sent"]
            row["dispatch_lag_p99_ms"] = w.stats["dispatch_lag"].percentile(99)
            for field in SIGNALS:
                row[field] = self.signals.get((lp, p), {}).get(field)
            out.append(row)
        return out
