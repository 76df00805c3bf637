"""Run summary: aggregate per-request results into the numbers a user reads first.

Field names follow `vllm bench serve` (``duration``, ``completed``, ``failed``,
``total_input_tokens``, ``total_output_tokens``, ``request_throughput``, ``output_throughput``,
``total_token_throughput``, ``mean_/median_/p99_`` of ``ttft_ms``, ``tpot_ms``, ``itl_ms``,
``e2el_ms``), plus replayer's own accounting (``scheduled``, ``sent``, ``cancelled``,
``not_started``, dispatch lag, usage audit). Statistics skip unmeasured values (``None``) and an
empty statistic is ``None`` (printed "n/a"), never 0 (cases B05, B13, B25). Token totals come
from the server's usage only: ``total_input_tokens`` / ``total_output_tokens`` add the
server-reported prompt / completion tokens of the completed requests that reported them
(``usage_missing`` counts the completed generation requests that did not), and are ``None``, as are
the throughputs built on them, when completed requests reported none. A request without usage has
no TPOT and no ITL (its output token count is unknown); the count of its token-carrying events is
only an estimate, summed apart as ``output_tokens_estimate``.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import verdict

PERCENTILES = (50, 90, 99)


def _stats(name: str, values: np.ndarray) -> dict[str, float | int | None]:
    v = values[~np.isnan(values)] if values.dtype.kind == "f" else values
    out: dict[str, float | int | None] = {f"{name}_count": int(v.size)}
    if v.size == 0:
        out.update({f"mean_{name}": None, f"median_{name}": None, f"std_{name}": None})
        out.update({f"p{p}_{name}": None for p in PERCENTILES})
        out[f"max_{name}"] = None
        return out
    out[f"mean_{name}"] = float(np.mean(v))
    out[f"median_{name}"] = float(np.median(v))
    out[f"std_{name}"] = float(np.std(v))
    for p, q in zip(PERCENTILES, np.percentile(v, PERCENTILES)):
        out[f"p{p}_{name}"] = float(q)
    out[f"max_{name}"] = float(np.max(v))
    return out


def _col(table: pa.Table, name: str, mask: np.ndarray | None = None) -> np.ndarray:
    arr = table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
    return arr if mask is None else arr[mask]


POOLING = ("/v1/embeddings", "/v1/score", "/v1/rerank")


def _pct(values: np.ndarray) -> dict[str, float | None]:
    v = values[~np.isnan(values)]
    if not v.size:
        return {"p50": None, "p99": None, "max": None}
    p50, p99 = np.percentile(v, (50, 99))
    return {"p50": float(p50), "p99": float(p99), "max": float(v.max())}


def _workloads(table: pa.Table, outcome: np.ndarray, ok: np.ndarray) -> dict:
    """Per-endpoint counts, the pooling usage audit and the session waits (when present)."""
    out: dict = {}
    names = table.column_names
    if "endpoint" in names:
        ep = np.asarray(table.column("endpoint").to_pylist(), dtype=object)
        kinds = sorted(set(ep.tolist()))
        if kinds != ["/v1/completions"]:
            e2e = _col(table, "e2e_ms")
            out["endpoints"] = {k: {"scheduled": int((ep == k).sum()), "completed": int((ok & (ep == k)).sum()),
                                    "failed": int(((outcome == "failed") & (ep == k)).sum()),
                                    "e2el_ms": _pct(e2e[ok & (ep == k)])} for k in kinds}
        audit = np.asarray(table.column("usage_audit").to_pylist(), dtype=object)
        pooled = np.isin(ep, POOLING) & (outcome != "not_started") & (outcome != "cancelled")
        if pooled.any():
            out["usage_audit"] = {k: {a: int((pooled & (ep == k) & (audit == a)).sum())
                                      for a in ("ok", "inflated", "missing")}
                                  for k in kinds if k in POOLING}
            out["usage_inflated"] = int((pooled & (audit == "inflated")).sum())
    if "session_id" in names and table.column("session_id").null_count < table.num_rows:
        sid = table.column("session_id").to_pylist()
        wait = _col(table, "session_wait_ms")
        out["sessions"] = {"sessions": len({x for x in sid if x is not None}),
                           "turns": int(sum(x is not None for x in sid)),
                           "turns_held": int(np.nansum(wait > 0)),
                           "session_wait_ms": _pct(wait)}
    return out


SERVER_TIMINGS = ("server_queue_time_ms", "server_time_to_first_token_ms", "server_generation_time_ms",
                  "client_overhead_ms")


def _server_timings(table: pa.Table, ok: np.ndarray) -> dict:
    """Statistics of the server's own timings and the client overhead over the successful
    generation requests that reported them (``--server-timings``); none when no request did."""
    names = table.column_names
    if not all(c in names for c in SERVER_TIMINGS) or all(table.column(c).null_count == table.num_rows
                                                          for c in SERVER_TIMINGS):
        return {}
    out: dict = {}
    for c in SERVER_TIMINGS:
        out.update(_stats(c, _col(table, c, ok)))
    return out


def summarize(table: pa.Table, slos: dict[str, float] | None = None) -> dict:
    """Summary dict of a results table (schema ``result.SCHEMA``). JSON-ready (None for n/a).

    Generation statistics (TTFT, TPOT, ITL, token audits) cover generation endpoints only;
    pooling requests (embeddings, score, rerank) have E2E latency and their own usage audit
    (``usage_audit``: ok / inflated / missing per endpoint; ``replayer.audit``). ``sessions``:
    session count, turns, turns held back for their predecessor and the wait (ms) it cost.
    ``slos`` (``--goodput`` bounds, ms): adds the verdict (``replayer.verdict.finish``'s fields)."""
    n = table.num_rows
    outcome = np.asarray(table.column("outcome").to_pylist(), dtype=object)
    ok_all = outcome == "success"
    ok = ok_all
    if "endpoint" in table.column_names:
        ok = ok_all & ~np.isin(np.asarray(table.column("endpoint").to_pylist(), dtype=object), POOLING)
    sent_ns = _col(table, "sent_ns")
    end_ns = _col(table, "end_ns")
    was_sent = ~np.isnan(sent_ns)
    duration = float((np.nanmax(end_ns) - np.nanmin(sent_ns)) / 1e9) if was_sent.any() else 0.0
    prompt_tokens = _col(table, "prompt_tokens", ok)
    completion = _col(table, "completion_tokens", ok)
    input_length = _col(table, "input_length", ok)
    output_length = _col(table, "output_length", ok)
    total_in = _known_sum(_col(table, "prompt_tokens", ok_all))
    total_out = _known_sum(completion)
    s: dict = {
        "scheduled": n,
        "sent": int(was_sent.sum()),
        "completed": int(ok_all.sum()),
        "failed": int((outcome == "failed").sum()),
        "cancelled": int((outcome == "cancelled").sum()),
        "not_started": int((outcome == "not_started").sum()),
        "duration": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
    }
    set_duration(s, duration)
    ttft = _col(table, "ttft_ms", ok)
    s.update(_stats("ttft_ms", ttft))
    s.update(_server_timings(table, ok))
    s.update(_stats("tpot_ms", _col(table, "tpot_ms", ok)))
    itl = pc.list_flatten(table.filter(pa.array(ok)).column("itl_ms")).to_numpy(zero_copy_only=False)
    s.update(_stats("itl_ms", itl.astype(np.float64)))
    s.update(_stats("e2el_ms", _col(table, "e2e_ms", ok_all)))
    # the same from the due time (coordinated-omission-free; a held session turn's from its release)
    due_to_send = (_col(table, "sent_ns"), _col(table, "due_ns"), _col(table, "session_wait_ms"))
    s.update(_stats("ttft_from_due_ms", verdict.from_due_ms(_col(table, "ttft_ms"), *due_to_send)[ok]))
    s.update(_stats("e2el_from_due_ms", verdict.from_due_ms(_col(table, "e2e_ms"), *due_to_send)[ok_all]))
    lag = _col(table, "dispatch_lag_ms", was_sent)
    lag_stats = _stats("dispatch_lag_ms", lag)
    s["dispatch_lag_p50_ms"] = lag_stats["median_dispatch_lag_ms"]
    s["dispatch_lag_p99_ms"] = lag_stats["p99_dispatch_lag_ms"]
    s["dispatch_lag_max_ms"] = lag_stats["max_dispatch_lag_ms"]
    # usage audit: the server's numbers against the trace's
    has_usage = ~np.isnan(prompt_tokens)
    s["usage_missing"] = int((~has_usage | np.isnan(completion)).sum())
    if "output_tokens_estimate" in table.column_names:  # (results files written before it existed)
        est = _col(table, "output_tokens_estimate", ok & np.isnan(_col(table, "completion_tokens")))
        s["output_tokens_estimate"] = int(np.nansum(est)) if est.size else None
        s["invalid_utf8"] = int(np.nansum(_col(table, "invalid_utf8")))
    s["prompt_token_mismatches"] = int((prompt_tokens[has_usage] != input_length[has_usage]).sum())
    drift = prompt_tokens[has_usage] - input_length[has_usage]  # server count - trace (text mode drifts)
    s["prompt_token_drift_total"] = int(drift.sum())
    s["prompt_token_drift_mean"] = float(drift.mean()) if drift.size else None
    s["prompt_token_drift_max_abs"] = int(np.abs(drift).max()) if drift.size else None
    has_c = ~np.isnan(completion)
    s["completion_token_mismatches"] = int((completion[has_c] != output_length[has_c]).sum())
    s["ttft_unmeasured"] = int(np.isnan(ttft).sum())
    s["zero_token_successes"] = int((completion[has_c] == 0).sum())
    exp = _col(table, "expected_prefix_hit_tokens", was_sent)
    s["expected_prefix_hit_tokens"] = int(np.nansum(exp)) if (~np.isnan(exp)).any() else None
    kinds = table.filter(pa.array(outcome == "failed")).column("error_kind").to_pylist()
    s["errors_by_kind"] = {k: kinds.count(k) for k in sorted(set(kinds))}
    if "partial_output_tokens" in table.column_names:  # output of failed/cancelled requests: in no total
        s["partial_output_tokens"] = int(np.nansum(_col(table, "partial_output_tokens")))
    s.update(_workloads(table, outcome, ok_all))
    if slos:
        completion_all = _col(table, "completion_tokens")
        codes = verdict.judge(outcome, _col(table, "ttft_ms"), _col(table, "tpot_ms"), _col(table, "e2e_ms"),
                              completion_all, slos)
        s.update(verdict.finish(verdict.fold(codes, completion_all), slos, duration))
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in s.items()}


#: above this many results, latency statistics come from a uniform random sample of about this many
SAMPLE_ROWS = 250_000
#: summary fields that are sums over requests (exact whatever the size, merged batch by batch)
_ADDITIVE = ("scheduled", "sent", "completed", "failed", "cancelled", "not_started", "total_input_tokens",
             "total_output_tokens", "usage_missing", "output_tokens_estimate", "invalid_utf8",
             "prompt_token_mismatches", "prompt_token_drift_total",
             "completion_token_mismatches", "ttft_unmeasured", "zero_token_successes",
             "expected_prefix_hit_tokens", "errors_by_kind", "usage_audit", "usage_inflated",
             "partial_output_tokens", *verdict.ADDITIVE)


def _add(a, b):
    """Sum of two summary values: ints add, dicts merge key by key; None is nothing."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _add(a.get(k), b.get(k)) for k in {**a, **b}}
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool):
        return a + b
    return a


def summarize_files(files: list[str], *, sample_rows: int = SAMPLE_ROWS, seed: int = 0,
                    slos: dict[str, float] | None = None) -> dict:
    """``summarize`` of results files in bounded memory (a days-long soak writes many millions of
    rows). Up to ``sample_rows`` rows: exactly ``summarize`` of them all. Above: counts, token
    totals, audits and the duration are exact (summed batch by batch); latency statistics come
    from a uniform random sample (Bernoulli, ``seed``) of about ``sample_rows`` requests, and the
    summary says so (``statistics_sample_rows``). ``duration`` (and the throughputs) add up the
    runs that wrote the files (``run_durations``): each resumed run has a time axis of its own.
    A damaged file (cut short, not Parquet) is reported by name, left out, and listed in
    ``damaged_files``; the others are summarized. ``slos``: the ``--goodput`` bounds (ms) to judge
    requests by (None: those the run that wrote the first file was given, from its metadata)."""
    from .recorder import open_file, read_file, report_damaged

    opened = {f: open_file(f) for f in files}
    damaged = [f for f, pf in opened.items() if pf is None]
    files = [f for f in files if opened[f] is not None]
    if slos is None:
        slos = goodput_of(opened[files[0]]) if files else {}
    total = sum(opened[f].metadata.num_rows for f in files)
    if total <= sample_rows:
        tables = [read_file(f) for f in files]
        damaged += [f for f, t in zip(files, tables) if t is None]
        tables = [t.replace_schema_metadata(None) for t in tables if t is not None]
        s = summarize(pa.concat_tables(tables) if tables else _empty(), slos)
    else:
        rng = np.random.default_rng(seed)
        p = sample_rows / total
        exact: dict = {}
        sample: list[pa.Table] = []
        for f in files:
            try:
                for batch in opened[f].iter_batches(batch_size=65_536):
                    t = pa.Table.from_batches([batch]).replace_schema_metadata(None)
                    part = summarize(t, slos)
                    exact = {k: _add(exact.get(k), part.get(k)) for k in _ADDITIVE if k in part or k in exact}
                    sample.append(t.filter(pa.array(rng.random(t.num_rows) < p)))
            except (OSError, pa.ArrowException) as e:  # the batches before the damage count
                report_damaged(f, e)
                damaged.append(f)
        sampled = pa.concat_tables(sample) if sample else _empty()
        s = summarize(sampled, slos)
        s.update(exact)
        s["statistics_sample_rows"] = sampled.num_rows
    if damaged:
        s["damaged_files"] = damaged
    runs = run_durations(files)
    set_duration(s, sum(runs))
    if len(runs) > 1:
        s["runs"] = len(runs)
    return s


def set_duration(s: dict, duration: float) -> None:
    """Set a summary's ``duration`` (s) and the throughputs (and goodputs) derived from it (None
    where a token total is unknown)."""
    s["duration"] = duration
    tin, tout = s["total_input_tokens"], s["total_output_tokens"]
    for key, num in (("request_throughput", s["completed"]), ("output_throughput", tout),
                     ("total_token_throughput", None if tin is None or tout is None else tin + tout)):
        s[key] = num / duration if duration > 0 and num is not None else None
    if s.get("goodput_slos_ms"):  # (the counts may have been summed: ratios and rates anew)
        s.update(verdict.finish(s, s["goodput_slos_ms"], duration))


def _known_sum(values: np.ndarray) -> int | None:
    """Sum of the known (non-NaN) values; None when there are values and none is known (an
    unknown total is never 0); 0 for no values at all."""
    known = values[~np.isnan(values)]
    return int(known.sum()) if known.size or not values.size else None


def goodput_of(pf: pq.ParquetFile) -> dict[str, float]:
    """The ``--goodput`` bounds (ms) of the run that wrote a results file ({} if none), from its
    metadata (``replayer.config``)."""
    try:
        cfg = json.loads((pf.schema_arrow.metadata or {}).get(b"replayer.config", b"{}"))
        return verdict.parse_goodput(cfg.get("goodput")) if isinstance(cfg, dict) else {}
    except ValueError:
        return {}


def run_durations(files: list[str]) -> list[float]:
    """Seconds from the first request sent to the last one ended, per run that wrote ``files``."""
    return [(b - a) / 1e9 for a, b in run_spans(files).values()]


def run_spans(files: list[str]) -> dict[bytes, tuple[int, int]]:
    """(first sent_ns, last end_ns) per run that wrote ``files``, keyed by the run anchor in each
    file's metadata (``replayer.t0_wall_s``, b"" if none): a resumed run's times are offsets
    from its own anchor. From the Parquet column statistics where present."""
    from .recorder import open_file

    spans: dict[bytes, tuple[int, int]] = {}
    for f in files:
        pf = open_file(f)
        if pf is None:  # damaged (reported): its rows are not counted either
            continue
        run = (pf.schema_arrow.metadata or {}).get(b"replayer.t0_wall_s", b"")
        try:
            lo, hi = _min_max(pf, "sent_ns", min), _min_max(pf, "end_ns", max)
        except (OSError, pa.ArrowException):
            continue
        if lo is None or hi is None:
            continue
        a, b = spans.get(run, (lo, hi))
        spans[run] = (min(a, lo), max(b, hi))
    return spans


def _min_max(pf: pq.ParquetFile, column: str, pick) -> int | None:
    """``pick`` (min or max) of a column's non-null values: from row-group statistics, or by
    reading the column where a row group has none."""
    md = pf.metadata
    idx = next(i for i in range(md.num_columns) if md.schema.column(i).path == column)
    vals = []
    for g in range(md.num_row_groups):
        st = md.row_group(g).column(idx).statistics
        if st is not None and st.has_min_max:
            vals.append(st.min if pick is min else st.max)
        elif st is None or st.null_count != md.row_group(g).num_rows:  # unknown: read it
            col = pf.read_row_group(g, columns=[column]).column(0)
            v = (pc.min if pick is min else pc.max)(col).as_py()
            if v is not None:
                vals.append(v)
    return pick(vals) if vals else None


def _empty() -> pa.Table:
    from .result import SCHEMA

    return SCHEMA.empty_table()


def read_summary(results_dir: str) -> dict:
    """A results folder's own ``summary.json`` as a dict ({} if it has none or it is not one)."""
    try:
        with open(os.path.join(results_dir, "summary.json"), encoding="utf-8") as f:
            s = json.load(f)
    except (OSError, ValueError):
        return {}
    return s if isinstance(s, dict) else {}


def format_summary(s: dict) -> str:
    """A fixed-width text table of the main summary fields (``n/a`` for None)."""

    def fmt(v: object) -> str:
        if v is None:
            return "n/a"
        if isinstance(v, float):
            return f"{v:,.2f}"
        if isinstance(v, int) and not isinstance(v, bool):
            return f"{v:,}"
        return str(v)

    rows: list[tuple[str, object] | str] = ["Replay result"]
    if s.get("stopped_early"):
        rows.append(("Stopped early (results partial)", f"by {s['stop_signal']}" if s.get("stop_signal") else "yes"))
    verdict_rows = verdict.verdict_rows(s)  # the verdict first, when there are bounds
    if verdict_rows:
        rows += ["Verdict (--goodput; failed = missed)", *verdict_rows, "Requests"]
    rows += [
        ("Scheduled requests", s["scheduled"]), ("Sent requests", s["sent"]),
        ("Successful requests", s["completed"]), ("Failed requests", s["failed"]),
        ("Cancelled / not started", f"{s['cancelled']:,} / {s['not_started']:,}"),
        ("Duration (s)", s["duration"]),
        ("Total input tokens (server)", s["total_input_tokens"]),
        ("Total output tokens (server)", s["total_output_tokens"]),
        ("Request throughput (req/s)", s["request_throughput"]),
        ("Output token throughput (tok/s)", s["output_throughput"]),
        ("Prompt-token mismatches vs trace", s["prompt_token_mismatches"]),
        ("Completion-token mismatches", s["completion_token_mismatches"]),
        ("Usage missing / TTFT unmeasured", f"{s['usage_missing']:,} / {s['ttft_unmeasured']:,}"),
        "Dispatch lag (sent - due)",
        ("p50 / p99 / max (ms)", " / ".join(fmt(s[k]) for k in
                                             ("dispatch_lag_p50_ms", "dispatch_lag_p99_ms", "dispatch_lag_max_ms"))),
    ]
    for name, label in (("ttft_ms", "Time to first token"), ("tpot_ms", "Time per output token (excl. 1st)"),
                        ("itl_ms", "Inter-token latency"), ("e2el_ms", "End-to-end latency")):
        rows.append(label)
        rows.append((f"mean / median / p99 (ms)", " / ".join(fmt(s[f"{k}_{name}"]) for k in ("mean", "median", "p99"))))
        if name in ("ttft_ms", "e2el_ms") and f"mean_{name[:-3]}_from_due_ms" in s:
            rows.append(("  from the due time (ms)", " / ".join(fmt(s[f"{k}_{name[:-3]}_from_due_ms"])
                                                              for k in ("mean", "median", "p99"))))
    if "client_overhead_ms_count" in s:
        rows.append("Server timings (--server-timings; mean / median / p99, ms)")
        for name, label in (("server_queue_time_ms", "Server queue time"),
                            ("server_time_to_first_token_ms", "Server TTFT (from scheduling)"),
                            ("server_generation_time_ms", "Server generation time"),
                            ("client_overhead_ms", "Client overhead (TTFT - queue - server TTFT)")):
            rows.append((label, " / ".join(fmt(s[f"{k}_{name}"]) for k in ("mean", "median", "p99"))))
    expected, server = s.get("expected_prefix_hit_tokens"), s.get("server_prefix_cache_hit_tokens")
    if isinstance(server, float) and server.is_integer():  # (a counter's delta: a float in Prometheus)
        server = int(server)
    if expected is not None or server is not None:
        rows.append("Prefix cache (prompt tokens served from it)")
        rows.append(("Expected from hash ids / server-reported", f"{fmt(expected)} / {fmt(server)}"))
    if s.get("sessions"):
        ss = s["sessions"]
        rows.append("Sessions (turn waits for its predecessor)")
        rows.append(("Sessions / turns / turns held", f"{ss['sessions']} / {ss['turns']} / {ss['turns_held']}"))
        w = ss["session_wait_ms"]
        rows.append(("Session wait p50 / p99 / max (ms)", " / ".join(fmt(w[k]) for k in ("p50", "p99", "max"))))
    if s.get("endpoints"):
        rows.append("Endpoints (completed / failed)")
        rows.extend((k, f"{v['completed']} / {v['failed']}") for k, v in s["endpoints"].items())
    if s.get("usage_audit"):
        rows.append("Pooling usage audit (ok / inflated / missing)")
        rows.extend((k, " / ".join(str(v[a]) for a in ("ok", "inflated", "missing")))
                    for k, v in s["usage_audit"].items())
    if s.get("errors_by_kind"):
        rows.append("Errors by kind")
        rows.extend((k, v) for k, v in s["errors_by_kind"].items())
    width = 50
    lines = []
    for r in rows:
        if isinstance(r, str):
            lines.append(f"{'-' * 4} {r} ".ljust(width + 14, "-"))
        else:
            lines.append(f"{r[0]:<{width - 8}}{fmt(r[1]):>22}")
    return "\n".join(lines)
