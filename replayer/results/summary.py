"""Run summary: aggregate per-request results into the numbers a user reads first.

Field names follow `vllm bench serve` (``duration``, ``completed``, ``failed``,
``total_input_tokens``, ``total_output_tokens``, ``request_throughput``, ``output_throughput``,
``total_token_throughput``, ``mean_/median_/p99_`` of ``ttft_ms``, ``tpot_ms``, ``itl_ms``,
``e2el_ms``), plus replayer's own accounting (``scheduled``, ``sent``, ``cancelled``,
``not_started``, dispatch lag, usage audit). Statistics skip unmeasured values (``None``) and an
empty statistic is ``None`` (printed "n/a"), never 0 (cases B05, B13, B25). Token totals come
from the server's usage; ``total_input_tokens`` counts the server-reported prompt tokens of
completed requests. Statistics are folded batch by batch (``SummaryFold``, ``replayer.core.stats``), so
a results folder of any size is summarized in bounded memory, and folds of files, shards and
runs merge (never their percentiles).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import replayer.results.httpclasses as httpclasses
import replayer.results.verdict as verdict
from replayer.core import usage
from replayer.core.errors import ErrorKind
from replayer.core.result import itl_samples
from replayer.core.stats import PERCENTILE_METHOD, Stat, stat_from_json, stat_to_json
from replayer.record.runwindows import removed_of as _removed_of, run_durations, run_windows
from replayer.results.concurrency import PeakFold, peak_of_files
from replayer.results.imagestats import COLUMNS as IMAGE_COLUMNS, ImageFold
from replayer.results.summarytext import format_summary
from replayer.results.warmtokens import WarmTokens

PERCENTILES = (50, 90, 99)
POOLING = ("/v1/embeddings", "/v1/score", "/v1/rerank")
#: the results columns the summary reads (a results file is read with only these)
COLUMNS = (
    "outcome",
    "error_kind",
    "http_status",
    "endpoint",
    "due_ns",
    "sent_ns",
    "end_ns",
    "first_token_ns",
    "last_token_ns",
    "prompt_tokens",
    "completion_tokens",
    "input_length",
    "output_length",
    "ttft_ms",
    "tpot_ms",
    "decode_tpot_ms",
    "e2e_ms",
    "ttft_from_due_ms",
    "e2el_from_due_ms",
    "dispatch_lag_ms",
    "expected_prefix_hit_tokens",
    "usage_audit",
    "session_id",
    "session_wait_ms",
    "queue_wait_ms",
    "warmup",
    "partial_output_tokens",
    "output_tokens_estimate",
    "invalid_utf8",
    "server_queue_time_ms",
    "server_time_to_first_token_ms",
    "server_generation_time_ms",
    "client_overhead_ms",
    *IMAGE_COLUMNS,
    "itl_ms",
    "itl_counts",
)
#: rows per batch read from a results file: ~1.4M ITL samples at Mooncake's ~350 tokens per
#: request, ~11 MB a float64 copy (the end-of-run summary of a 250k-row folder peaked at 274 MB
#: with 4,096, 346 MB with 8,192)
BATCH_ROWS = 4_096
#: the count fields of the summary (each a sum over requests)
_COUNTS = (
    "scheduled",
    "sent",
    "completed",
    "failed",
    "cancelled",
    "not_started",
    "missed_while_down",
    "total_input_tokens",
    "total_output_tokens",
    "usage_missing",
    "prompt_token_mismatches",
    "prompt_token_drift_total",
    "completion_token_mismatches",
    "ttft_unmeasured",
    "zero_token_successes",
    "expected_prefix_hit_tokens",
    "expected_prefix_known",
    "usage_inflated",
    "session_turns",
    "turns_held",
    "turns_lost",  # (issue 47) turns not sent: an earlier turn of the session failed
    "partial_output_tokens",
    "decode_tpot_unknown",  # (issue 47) tpot_ms known, the first chunk's token count not
    "http_rate_limited",  # (issue 47: results.httpclasses)
    "http_overloaded",
    "http_other",
    "input_tokens_known",
    "input_tokens_values",
    "output_tokens_known",
    "output_tokens_values",
    "output_tokens_estimate",
    "invalid_utf8",
    "queue_capped",
    "queue_waited",
    "warmup_requests",
    "warmup_sent",
    "warmup_completed",
    "warmup_failed",
)
#: the server's own timings (``--server-timings``), summarized when any request reported them
SERVER_TIMINGS = (
    "server_queue_time_ms",
    "server_time_to_first_token_ms",
    "server_generation_time_ms",
    "client_overhead_ms",
)


def _add(a, b):
    """Sum of two count values: ints add, dicts merge key by key; None is nothing."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _add(a.get(k), b.get(k)) for k in {**a, **b}}
    return a + b


def _is(col: pa.ChunkedArray | pa.Array, value: str) -> np.ndarray:
    """Boolean numpy mask: ``col == value`` (null is False)."""
    return pc.fill_null(pc.equal(col, value), False).to_numpy(zero_copy_only=False)


def _f64_opt(t: pa.Table | pa.RecordBatch, name: str) -> np.ndarray:
    """Column ``name`` as float64, all NaN (unknown) where a results file has no such column."""
    if name in t.schema.names:
        return _f64(t.column(name))
    return np.full(t.num_rows, np.nan)


def _f64(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A numeric column as float64 (null -> NaN)."""
    return col.to_numpy(zero_copy_only=False).astype(np.float64)


def _nansum(v: np.ndarray) -> int:
    return int(np.nansum(v))


class SummaryFold:
    """The summary's state, folded results batch by batch (``add``) and mergeable (``merge``):
    counts and token totals as integers, each latency as a ``stats.Stat`` (exact count, sum,
    min, max, variance; percentiles exact or from a DDSketch), error kinds, per-endpoint counts,
    the pooling usage audit and session ids. Its memory does not grow with the number of
    requests or ITL samples (the set of session ids grows with the number of sessions)."""

    def __init__(self, slos: dict[str, float] | None = None) -> None:
        self.slos = slos or {}  # --goodput bounds (ms): each request judged (replayer.results.verdict)
        self.verdict: dict = {}  # verdict.fold's counts, summed
        self.partial_known = False  # a results file had partial_output_tokens
        self.estimate_known = False  # a results file had output_tokens_estimate
        self.n = dict.fromkeys(_COUNTS, 0)
        self.stats: dict[str, Stat] = {}
        self.errors: dict[str, int] = {}
        self.endpoints: dict[str, dict[str, int]] = {}  # endpoint -> scheduled/completed/failed
        self.audit: dict[str, dict[str, int]] = {}  # pooling endpoint -> ok/inflated/missing
        self.sessions: set[str] = set()
        self.sent_min = math.inf
        self.end_max = -math.inf
        self.drift_max_abs: int | None = None
        self.pooled = False
        self.images = ImageFold()
        self.warmup_last_sent = -math.inf  # the last warm-up request's send (ns after its run's anchor)
        self.warm_tokens = WarmTokens()  # (issue 47) warm-up tokens streamed past the boundary count

    def stat(self, key: str) -> Stat:
        return self.stats.setdefault(key, Stat())

    def add(self, t: pa.Table | pa.RecordBatch) -> None:  # noqa: C901, PLR0915
        """Fold a batch of results (schema ``result.SCHEMA``, any subset of ``COLUMNS``). Warm-up
        rows (``warmup`` true) are counted apart (``_add_warmup``) and left out of everything else."""
        names = t.schema.names
        n = self.n
        if "warmup" in names:
            t = self._split_warmup(t)
        outcome = t.column("outcome")
        ok_all = _is(outcome, "success")
        failed = _is(outcome, "failed")
        ep = t.column("endpoint") if "endpoint" in names else None
        ok = (
            ok_all & ~pc.fill_null(pc.is_in(ep, pa.array(POOLING)), False).to_numpy(zero_copy_only=False)
            if ep is not None
            else ok_all
        )
        sent_ns, end_ns = _f64(t.column("sent_ns")), _f64(t.column("end_ns"))
        was_sent = ~np.isnan(sent_ns)
        if was_sent.any():
            self.sent_min = min(self.sent_min, float(np.nanmin(sent_ns)))
        if (~np.isnan(end_ns)).any():
            self.end_max = max(self.end_max, float(np.nanmax(end_ns)))
        n["scheduled"] += t.num_rows
        n["sent"] += int(was_sent.sum())
        n["completed"] += int(ok_all.sum())
        n["failed"] += int(failed.sum())
        n["cancelled"] += int(_is(outcome, "cancelled").sum())
        n["not_started"] += int(_is(outcome, "not_started").sum())
        n["missed_while_down"] += int(_is(outcome, "missed_while_down").sum())
        prompt_all = _f64(t.column("prompt_tokens"))
        prompt, completion = prompt_all[ok], _f64(t.column("completion_tokens"))[ok]
        input_length, output_length = _f64(t.column("input_length"))[ok], _f64(t.column("output_length"))[ok]
        n["total_input_tokens"] += _nansum(prompt_all[ok_all])
        n["total_output_tokens"] += _nansum(completion)
        # an unknown total is never 0: None when completed requests reported no usage at all
        n["input_tokens_known"] += int((~np.isnan(prompt_all[ok_all])).sum())
        n["input_tokens_values"] += int(ok_all.sum())
        n["output_tokens_known"] += int((~np.isnan(completion)).sum())
        n["output_tokens_values"] += completion.size
        if "output_tokens_estimate" in names:  # (results files written before it existed)
            self.estimate_known = True
            n["output_tokens_estimate"] += _nansum(_f64(t.column("output_tokens_estimate"))[ok][np.isnan(completion)])
            n["invalid_utf8"] += _nansum(_f64(t.column("invalid_utf8"))) if "invalid_utf8" in names else 0
        for c in SERVER_TIMINGS:
            if c in names and t.column(c).null_count < t.num_rows:
                self.stat(c).add(_f64(t.column(c))[ok])
        ttft = _f64(t.column("ttft_ms"))[ok]
        self.stat("ttft_ms").add(ttft)
        self.stat("tpot_ms").add(_f64(t.column("tpot_ms"))[ok])
        decode = _f64_opt(t, "decode_tpot_ms")[ok]  # (issue 47) unknown: left out, and counted
        self.stat("decode_tpot_ms").add(decode)
        n["decode_tpot_unknown"] += int((~np.isnan(_f64(t.column("tpot_ms"))[ok]) & np.isnan(decode)).sum())
        # this batch's ITL samples only: a run's ITL lists are never held whole
        self.stat("itl_ms").add(itl_samples(t, ok))  # (either ITL form: result.compact_itl)
        e2e = _f64(t.column("e2e_ms"))
        self.stat("e2el_ms").add(e2e[ok_all])
        if "ttft_from_due_ms" in names:  # the same from the due time, as derive() recorded it
            self.stat("ttft_from_due_ms").add(_f64(t.column("ttft_from_due_ms"))[ok])
            self.stat("e2el_from_due_ms").add(_f64(t.column("e2el_from_due_ms"))[ok_all])
        if "partial_output_tokens" in names:  # output of failed/cancelled requests: in no total
            self.partial_known = True
            n["partial_output_tokens"] += _nansum(_f64(t.column("partial_output_tokens")))
        if self.slos:
            completion_all = _f64(t.column("completion_tokens"))
            codes = verdict.judge(
                np.asarray(outcome.to_pylist(), dtype=object),
                _f64(t.column("ttft_ms")),
                _f64(t.column("tpot_ms")),
                e2e,
                completion_all,
                self.slos,
            )
            self.verdict = _add(self.verdict, verdict.fold(codes, completion_all))
        self.stat("dispatch_lag_ms").add(_f64(t.column("dispatch_lag_ms"))[was_sent])
        if "queue_wait_ms" in names:  # --max-concurrency: the wait for a slot of each request sent
            self._add_queue_wait(_f64(t.column("queue_wait_ms"))[was_sent])
        self.images.add(t, was_sent, ok)
        # usage audit: the server's numbers against the trace's (replayer.core.usage)
        mm = "images" in names
        audit = usage.of_columns(
            prompt,
            completion,
            input_length,
            output_length,
            images=_f64(t.column("images"))[ok] if mm else None,
            text_tokens=_f64(t.column("text_tokens"))[ok] if mm else None,
        )
        n["usage_missing"] += int(audit.missing.sum())
        n["prompt_token_mismatches"] += int(audit.prompt.sum())
        drift = audit.drift  # server count - trace (text mode drifts)
        n["prompt_token_drift_total"] += int(drift.sum())
        self.stat("prompt_token_drift").add(drift)
        if drift.size:
            self.drift_max_abs = max(self.drift_max_abs or 0, int(np.abs(drift).max()))
        n["completion_token_mismatches"] += int(audit.completion.sum())
        has_c = ~np.isnan(completion)
        n["ttft_unmeasured"] += int(np.isnan(ttft).sum())
        n["zero_token_successes"] += int((completion[has_c] == 0).sum())
        exp = _f64(t.column("expected_prefix_hit_tokens"))[was_sent]
        n["expected_prefix_hit_tokens"] += _nansum(exp)
        n["expected_prefix_known"] += int((~np.isnan(exp)).sum())
        for kc in pc.value_counts(t.column("error_kind").filter(pa.array(failed))).to_pylist():
            self.errors[kc["values"]] = self.errors.get(kc["values"], 0) + kc["counts"]
        httpclasses.count(n, t, failed)  # 429 and 503 told apart (issue 47)
        if ep is not None:
            self._add_endpoints(t, ep, outcome, ok_all, failed, e2e)
        if "session_id" in names:
            sid = pc.drop_null(t.column("session_id"))
            if len(sid):
                self.sessions.update(pc.unique(sid).to_pylist())
                n["session_turns"] += len(sid)
                wait = _f64(t.column("session_wait_ms"))
                n["turns_held"] += int(np.nansum(wait > 0))
                lost = pc.equal(t.column("error_kind"), ErrorKind.DEPENDENCY.value)
                n["turns_lost"] += int(pc.sum(pc.cast(lost, pa.int64())).as_py() or 0)
                self.stat("session_wait_ms").add(wait)

    def _split_warmup(self, t: pa.Table | pa.RecordBatch) -> pa.Table | pa.RecordBatch:
        """The rows of ``t`` that are not warm-up; the warm-up rows counted (``_add_warmup``)."""
        warm = pc.fill_null(t.column("warmup"), False)
        if not pc.any(warm).as_py():
            return t
        self._add_warmup(t.filter(warm))
        return t.filter(pc.invert(warm))

    def _add_queue_wait(self, wait: np.ndarray) -> None:
        """``queue_wait_ms`` of the requests sent (NaN: no cap), counted and folded."""
        wait = wait[~np.isnan(wait)]
        if wait.size:
            self.n["queue_capped"] += wait.size
            self.n["queue_waited"] += int((wait > 0).sum())
            self.stat("queue_wait_ms").add(wait)

    def _add_warmup(self, t: pa.Table | pa.RecordBatch) -> None:
        """Count the warm-up rows of a batch (in no other statistic) and their last send."""
        n, outcome = self.n, t.column("outcome")
        n["warmup_requests"] += t.num_rows
        sent = _f64(t.column("sent_ns"))
        n["warmup_sent"] += int((~np.isnan(sent)).sum())
        n["warmup_completed"] += int(_is(outcome, "success").sum())
        n["warmup_failed"] += int(_is(outcome, "failed").sum())
        if (~np.isnan(sent)).any():
            self.warmup_last_sent = max(self.warmup_last_sent, float(np.nanmax(sent)))
        ok = _is(outcome, "success")
        self.warm_tokens.add(
            _f64_opt(t, "first_token_ns")[ok], _f64_opt(t, "last_token_ns")[ok], _f64(t.column("completion_tokens"))[ok]
        )

    def _add_endpoints(self, t, ep, outcome, ok_all: np.ndarray, failed: np.ndarray, e2e: np.ndarray) -> None:
        """Per-endpoint counts and E2E, and the pooling usage audit (``replayer.http.audit``)."""
        kinds = [k for k in pc.unique(ep).to_pylist() if k is not None]
        audit = t.column("usage_audit")
        pooled_rows = ~(_is(outcome, "not_started") | _is(outcome, "cancelled") | _is(outcome, "missed_while_down"))
        for k in kinds:
            mine = _is(ep, k)
            e = self.endpoints.setdefault(k, {"scheduled": 0, "completed": 0, "failed": 0})
            e["scheduled"] += int(mine.sum())
            e["completed"] += int((ok_all & mine).sum())
            e["failed"] += int((failed & mine).sum())
            self.stat(f"e2el_ms {k}").add(e2e[ok_all & mine])
            if k in POOLING and (mine & pooled_rows).any():
                self.pooled = True
                a = self.audit.setdefault(k, {"ok": 0, "inflated": 0, "missing": 0})
                for name in a:
                    c = int((mine & pooled_rows & _is(audit, name)).sum())
                    a[name] += c
                    if name == "inflated":
                        self.n["usage_inflated"] += c

    def merge(self, other: "SummaryFold") -> None:
        """Fold in another fold's results (a file, a shard, a worker, a resumed run)."""
        for k, v in other.n.items():
            self.n[k] += v
        for k, s in other.stats.items():
            self.stat(k).merge(s)
        for k, c in other.errors.items():
            self.errors[k] = self.errors.get(k, 0) + c
        for mine, theirs in ((self.endpoints, other.endpoints), (self.audit, other.audit)):
            for k, counts in theirs.items():
                d = mine.setdefault(k, dict.fromkeys(counts, 0))
                for name, c in counts.items():
                    d[name] += c
        self.sessions |= other.sessions
        self.slos = self.slos or other.slos
        self.verdict = _add(self.verdict, other.verdict)
        self.partial_known |= other.partial_known
        self.estimate_known |= other.estimate_known
        self.sent_min = min(self.sent_min, other.sent_min)
        self.end_max = max(self.end_max, other.end_max)
        if other.drift_max_abs is not None:
            self.drift_max_abs = max(self.drift_max_abs or 0, other.drift_max_abs)
        self.pooled |= other.pooled
        self.images.merge(other.images)
        self.warmup_last_sent = max(self.warmup_last_sent, other.warmup_last_sent)
        self.warm_tokens.merge(other.warm_tokens)

    def result(self) -> dict:
        """The summary dict (JSON-ready; None for n/a); ``duration`` from the first send to the
        last end of the rows folded (``summarize_files`` sets it per run)."""
        n = self.n
        duration = (self.end_max - self.sent_min) / 1e9 if n["sent"] and self.end_max > -math.inf else 0.0
        s: dict = {k: n[k] for k in ("scheduled", "sent", "completed", "failed", "cancelled", "not_started")}
        if n["missed_while_down"]:  # (a fleet shard that rejoined: its rows due while it was down)
            s["missed_while_down"] = n["missed_while_down"]
        s["duration"] = duration
        s["total_input_tokens"] = (
            n["total_input_tokens"] if n["input_tokens_known"] or not n["input_tokens_values"] else None
        )
        s["total_output_tokens"] = (
            n["total_output_tokens"] if n["output_tokens_known"] or not n["output_tokens_values"] else None
        )
        set_duration(s, duration)
        s.update(self.stat("ttft_ms").summary("ttft_ms", PERCENTILES))
        if any(c in self.stats for c in SERVER_TIMINGS):
            for c in SERVER_TIMINGS:
                s.update(self.stat(c).summary(c, PERCENTILES))
        for name in ("tpot_ms", "decode_tpot_ms", "itl_ms", "e2el_ms", "ttft_from_due_ms", "e2el_from_due_ms"):
            s.update(self.stat(name).summary(name, PERCENTILES))
        s["decode_tpot_unknown"] = n["decode_tpot_unknown"]
        lag = self.stat("dispatch_lag_ms")
        s["dispatch_lag_p50_ms"], s["dispatch_lag_p99_ms"] = lag.percentile(50), lag.percentile(99)
        s["dispatch_lag_max_ms"] = lag.max if lag.count else None
        s["usage_missing"] = n["usage_missing"]
        if self.estimate_known:
            s["output_tokens_estimate"] = (
                n["output_tokens_estimate"] if n["output_tokens_values"] > n["output_tokens_known"] else None
            )
            s["invalid_utf8"] = n["invalid_utf8"]
        for k in ("prompt_token_mismatches", "prompt_token_drift_total"):
            s[k] = n[k]
        drift = self.stat("prompt_token_drift")
        s["prompt_token_drift_mean"] = drift.total / drift.count if drift.count else None
        s["prompt_token_drift_max_abs"] = self.drift_max_abs
        for k in ("completion_token_mismatches", "ttft_unmeasured", "zero_token_successes"):
            s[k] = n[k]
        s["expected_prefix_hit_tokens"] = n["expected_prefix_hit_tokens"] if n["expected_prefix_known"] else None
        s["errors_by_kind"] = {k: self.errors[k] for k in sorted(self.errors)}
        s.update(httpclasses.section(n))
        if self.partial_known:
            s["partial_output_tokens"] = n["partial_output_tokens"]
        s.update(self.images.result())
        if self.endpoints and sorted(self.endpoints) != ["/v1/completions"]:
            s["endpoints"] = {
                k: {**self.endpoints[k], "e2el_ms": self._pct(f"e2el_ms {k}")} for k in sorted(self.endpoints)
            }
        if self.pooled:
            s["usage_audit"] = {
                k: self.audit.get(k, {"ok": 0, "inflated": 0, "missing": 0})
                for k in sorted(self.endpoints)
                if k in POOLING
            }
            s["usage_inflated"] = n["usage_inflated"]
        if n["session_turns"]:
            s["sessions"] = {
                "sessions": len(self.sessions),
                "turns": n["session_turns"],
                "turns_held": n["turns_held"],
                "turns_lost": n["turns_lost"],
                "session_wait_ms": self._pct("session_wait_ms"),
            }
        if n["queue_capped"]:
            s["concurrency_cap"] = self._cap_section()
        if n["warmup_requests"]:
            s["warmup"] = {
                "requests": n["warmup_requests"],
                "sent": n["warmup_sent"],
                "completed": n["warmup_completed"],
                "failed": n["warmup_failed"],
                "last_sent_s": self.warmup_last_sent / 1e9 if math.isfinite(self.warmup_last_sent) else None,
                "output_tokens_after_boundary": self.warm_tokens.within(self.sent_min, self.end_max),
            }
            set_duration(s, duration)  # (the window's throughput counts those tokens)
        if self.slos:
            s.update(
                verdict.finish(
                    self.verdict or verdict.fold({"all": np.zeros(0, np.int8)}, np.zeros(0)), self.slos, duration
                )
            )
        s["percentile_method"] = PERCENTILE_METHOD
        shown = ["ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "ttft_from_due_ms", "e2el_from_due_ms", "dispatch_lag_ms"]
        shown += [f"e2el_ms {k}" for k in s.get("endpoints", ())] + ["session_wait_ms"] * ("sessions" in s)
        s["percentiles_sketched"] = [
            k.replace(" ", "@") for k in shown if self.stat(k).count and not self.stat(k).exact
        ]
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in s.items()}

    def _cap_section(self) -> dict:
        """``--max-concurrency``'s section: the requests sent under the cap, how many waited for a
        slot (the cap was the bottleneck for them) and the wait's statistics over all of them
        (0 for those that found a slot free)."""
        n, st = self.n, self.stat("queue_wait_ms")
        return {
            "requests": n["queue_capped"],
            "waited": n["queue_waited"],
            "waited_share": n["queue_waited"] / n["queue_capped"],
            "queue_wait_ms": {
                "mean": st.total / st.count if st.count else None,
                **{f"p{p}": st.percentile(p) for p in PERCENTILES},
                "max": st.max if st.count else None,
            },
        }

    def _pct(self, key: str) -> dict[str, float | None]:
        st = self.stat(key)
        return {"p50": st.percentile(50), "p99": st.percentile(99), "max": st.max if st.count else None}


def summarize(table: pa.Table, slos: dict[str, float] | None = None) -> dict:
    """Summary dict of a results table (schema ``result.SCHEMA``). JSON-ready (None for n/a).

    Generation statistics (TTFT, TPOT, ITL, token audits) cover generation endpoints only;
    pooling requests (embeddings, score, rerank) have E2E latency and their own usage audit
    (``usage_audit``: ok / inflated / missing per endpoint; ``replayer.http.audit``). ``sessions``:
    session count, turns, turns held back for their predecessor and the wait (ms) it cost.
    Percentiles: ``stats.PERCENTILE_METHOD`` (said in ``percentile_method``; the statistics
    whose percentiles came from the sketch are listed in ``percentiles_sketched``). ``slos``
    (``--goodput`` bounds, ms): adds the verdict (``replayer.results.verdict.finish``'s fields)."""
    fold = SummaryFold(slos)
    fold.add(table)
    s = fold.result()
    peaks = PeakFold()
    if {"sent_ns", "end_ns"} <= set(table.schema.names):
        peaks.add(table)
    s.update(peaks.peak().fields())  # the most requests in flight at once
    return s


def fold_file(path: str, slos: dict[str, float] | None = None) -> SummaryFold | None:
    """A results file folded batch by batch (``BATCH_ROWS`` rows, only the ``COLUMNS`` it has),
    or None when it is damaged (reported by name; none of its rows count)."""
    from replayer.record.folder import open_file, report_damaged

    pf = open_file(path)
    if pf is None:
        return None
    fold = SummaryFold(slos)
    columns = [c for c in COLUMNS if c in pf.schema_arrow.names]
    try:
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=columns):
            fold.add(batch)
    except (OSError, pa.ArrowException) as e:
        report_damaged(path, e)
        return None
    return fold


def fold_files(files: list[str], slos: dict[str, float] | None = None) -> tuple[SummaryFold, list[str]]:
    """(every readable file of ``files`` folded into one, the damaged files). ``slos``: the
    ``--goodput`` bounds (ms) to judge requests by (None: those the run that wrote the first
    readable file was given, from its metadata: ``goodput_of``). The results retention removed
    from the folders of ``files`` are merged from their digest (``retention``: counts exact,
    percentiles from the sketch)."""
    from replayer.record.folder import open_file

    if slos is None:
        slos = next((goodput_of(pf) for f in files if (pf := open_file(f)) is not None), {})
    total, damaged = SummaryFold(slos), []
    for f in files:
        fold = fold_file(f, slos)
        if fold is None:
            damaged.append(f)
        else:
            total.merge(fold)
    for removed in _removed_of(files):  # results files retention removed: their digest
        if removed.fold_json:
            total.merge(fold_from_json(removed.fold_json))
    return total, damaged


# -- the fold as JSON (retention keeps a removed file's fold in removed.json) --
def fold_to_json(fold) -> dict:
    """A ``summary.SummaryFold`` as JSON (its statistics as ``stats.stat_to_json``)."""
    return {
        "n": fold.n,
        "stats": {k: stat_to_json(s) for k, s in fold.stats.items()},
        "errors": fold.errors,
        "endpoints": fold.endpoints,
        "audit": fold.audit,
        "sessions": sorted(fold.sessions),
        "verdict": fold.verdict,
        "slos": fold.slos,
        "partial_known": fold.partial_known,
        "estimate_known": fold.estimate_known,
        "sent_min": fold.sent_min if math.isfinite(fold.sent_min) else None,
        "end_max": fold.end_max if math.isfinite(fold.end_max) else None,
        "drift_max_abs": fold.drift_max_abs,
        "pooled": fold.pooled,
        "images": {"n": fold.images.n, "seen": fold.images.seen},
        "warmup_last_sent": fold.warmup_last_sent if math.isfinite(fold.warmup_last_sent) else None,
        "warm_tokens": [
            fold.warm_tokens.first.tolist(),
            fold.warm_tokens.last.tolist(),
            fold.warm_tokens.tokens.tolist(),
        ],
    }


def fold_from_json(d: dict):
    """The ``summary.SummaryFold`` that ``fold_to_json`` wrote."""
    fold = SummaryFold(d.get("slos") or {})
    for k, v in d.get("n", {}).items():
        fold.n[k] = fold.n.get(k, 0) + v
    fold.stats = {k: stat_from_json(v) for k, v in d.get("stats", {}).items()}
    fold.errors = dict(d.get("errors", {}))
    fold.endpoints = {k: dict(v) for k, v in d.get("endpoints", {}).items()}
    fold.audit = {k: dict(v) for k, v in d.get("audit", {}).items()}
    fold.sessions = set(d.get("sessions", []))
    fold.verdict = _verdict_from_json(d.get("verdict") or {})
    fold.partial_known, fold.estimate_known = bool(d.get("partial_known")), bool(d.get("estimate_known"))
    fold.sent_min = d["sent_min"] if d.get("sent_min") is not None else math.inf
    fold.end_max = d["end_max"] if d.get("end_max") is not None else -math.inf
    fold.drift_max_abs = d.get("drift_max_abs")
    fold.pooled = bool(d.get("pooled"))
    images = d.get("images") or {}
    for k, v in images.get("n", {}).items():
        fold.images.n[k] = fold.images.n.get(k, 0) + v
    fold.images.seen = bool(images.get("seen"))
    if d.get("warmup_last_sent") is not None:
        fold.warmup_last_sent = d["warmup_last_sent"]
    if d.get("warm_tokens"):
        fold.warm_tokens.add(*(np.asarray(v, dtype=np.float64) for v in d["warm_tokens"]))
    return fold


def jsonable(v):
    """numpy values and arrays (the verdict's counts) as JSON values."""
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return {"__array__": v.tolist()}
    if isinstance(v, np.generic):
        return v.item()
    return v


def _verdict_from_json(v):
    if isinstance(v, dict):
        if set(v) == {"__array__"}:
            return np.asarray(v["__array__"])
        return {k: _verdict_from_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_verdict_from_json(x) for x in v]
    return v


def summarize_files(files: list[str], *, slos: dict[str, float] | None = None, held: pa.Table | None = None) -> dict:
    """``summarize`` of results files, read in bounded memory (a days-long soak writes many
    millions of rows): batch by batch, only the columns the summary needs, folded into one
    ``SummaryFold`` (counts exact, statistics from ``stats.Stat``: exact count, sum, min, max
    and variance at any size; percentiles exact up to ``stats.EXACT_LIMIT`` values, else within
    the sketch's stated relative error). ``duration`` (and the throughputs) add up the runs
    that wrote the files (``run_durations``): each resumed run has a time axis of its own.
    A damaged file (cut short, not Parquet) is reported by name, left out, and listed in
    ``damaged_files``; the others are summarized. ``slos``: the ``--goodput`` bounds (ms) to judge
    requests by (None: those the run that wrote the first file was given, from its metadata).
    ``held``: results the run could not write (a full disk), counted as if on disk and
    counted in ``results_not_written``. ``max_concurrent_requests``: the most requests in flight
    at once, exact, and when (``replayer.results.concurrency``; files retention removed are not
    in it)."""
    fold, damaged = fold_files(files, slos)
    held = held if held is not None and held.num_rows else None
    if held is not None:
        one = SummaryFold(fold.slos)
        one.add(held.select([c for c in COLUMNS if c in held.schema.names]))
        fold.merge(one)
    s = fold.result()
    if damaged:
        s["damaged_files"] = damaged
    if held is not None:
        s["results_not_written"] = held.num_rows
    peak = peak_of_files([f for f in files if f not in damaged], held)
    s.update(peak.fields())  # the most requests in flight at once (exact)
    runs = run_durations([f for f in files if f not in damaged], [held] if held is not None else [])
    set_duration(s, sum(runs))
    if len(runs) > 1:
        s["runs"] = len(runs)
    return s


def set_duration(s: dict, duration: float) -> None:
    """Set a summary's ``duration`` (s) and the throughputs (and goodputs) derived from it (None
    where a token total is unknown)."""
    s["duration"] = duration
    tin, tout = s["total_input_tokens"], s["total_output_tokens"]
    if tout is not None:  # warm-up tokens streamed inside the window (issue 47: cut by token)
        tout += (s.get("warmup") or {}).get("output_tokens_after_boundary", 0)
    for key, num in (
        ("request_throughput", s["completed"]),
        ("output_throughput", tout),
        ("total_token_throughput", None if tin is None or tout is None else tin + tout),
    ):
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


def read_summary(results_dir: str) -> dict:
    """A results folder's own ``summary.json`` as a dict ({} if it has none or it is not one)."""
    try:
        with open(os.path.join(results_dir, "summary.json"), encoding="utf-8") as f:
            s = json.load(f)
    except (OSError, ValueError):
        return {}
    return s if isinstance(s, dict) else {}


__all__ = [
    "BATCH_ROWS",
    "COLUMNS",
    "PERCENTILES",
    "SummaryFold",
    "fold_file",
    "fold_files",
    "format_summary",
    "goodput_of",
    "read_summary",
    "run_durations",
    "run_windows",
    "set_duration",
    "summarize",
    "summarize_files",
]
