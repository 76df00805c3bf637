"""The run summary's state (``SummaryFold``): per-request results folded batch by batch into
counts, token totals and latency statistics (``core.stats.Stat``), mergeable across files, shards
and runs (never their percentiles), and turned into the summary dict (``result``). Its memory does
not grow with the number of requests."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import replayer.results.httpclasses as httpclasses
import replayer.results.verdict as verdict
from replayer.core import usage
from replayer.core.errors import ErrorKind
from replayer.core.result import itl_samples
from replayer.core.stats import PERCENTILE_METHOD, Stat
from replayer.results.foldcolumns import (
    COUNTS,
    PERCENTILES,
    POOLING,
    SERVER_TIMINGS,
    add_counts,
    f64,
    f64_or_nan,
    mask,
    nansum,
)
from replayer.results.imagestats import ImageFold
from replayer.results.warmtokens import WarmTokens


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
        self.n = dict.fromkeys(COUNTS, 0)
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

    def add(self, t: pa.Table | pa.RecordBatch) -> None:
        """Fold a batch of results (schema ``result.SCHEMA``, any subset of ``COLUMNS``). Warm-up
        rows (``warmup`` true) are counted apart (``_add_warmup``) and left out of everything else.
        The columns several sections use are read once and handed to them."""
        names = t.schema.names
        if "warmup" in names:
            t = self._split_warmup(t)
        outcome = t.column("outcome")
        ok_all = mask(outcome, "success")
        failed = mask(outcome, "failed")
        ep = t.column("endpoint") if "endpoint" in names else None
        ok = (  # generation requests that succeeded (pooling ones have E2E and their own audit)
            ok_all & ~pc.fill_null(pc.is_in(ep, pa.array(POOLING)), False).to_numpy(zero_copy_only=False)
            if ep is not None
            else ok_all
        )
        was_sent = self._add_outcomes(t, outcome, ok_all, failed)
        prompt_all, completion_all = f64(t.column("prompt_tokens")), f64(t.column("completion_tokens"))
        self._add_tokens(t, prompt_all, completion_all[ok], ok_all, ok)
        e2e = f64(t.column("e2e_ms"))
        ttft = self._add_latencies(t, e2e, ok_all, ok)
        if self.slos:
            codes = verdict.judge(
                np.asarray(outcome.to_pylist(), dtype=object),
                f64(t.column("ttft_ms")),
                f64(t.column("tpot_ms")),
                e2e,
                completion_all,
                self.slos,
            )
            self.verdict = add_counts(self.verdict, verdict.fold(codes, completion_all))
        self.stat("dispatch_lag_ms").add(f64(t.column("dispatch_lag_ms"))[was_sent])
        if "queue_wait_ms" in names:  # --max-concurrency: the wait for a slot of each request sent
            self._add_queue_wait(f64(t.column("queue_wait_ms"))[was_sent])
        self.images.add(t, was_sent, ok)
        self._add_audit(t, prompt_all[ok], completion_all[ok], ttft, ok)
        exp = f64(t.column("expected_prefix_hit_tokens"))[was_sent]
        self.n["expected_prefix_hit_tokens"] += nansum(exp)
        self.n["expected_prefix_known"] += int((~np.isnan(exp)).sum())
        for kc in pc.value_counts(t.column("error_kind").filter(pa.array(failed))).to_pylist():
            self.errors[kc["values"]] = self.errors.get(kc["values"], 0) + kc["counts"]
        httpclasses.count(self.n, t, failed)  # 429 and 503 told apart (issue 47)
        if ep is not None:
            self._add_endpoints(t, ep, outcome, ok_all, failed, e2e)
        if "session_id" in names:
            self._add_sessions(t)

    def _add_outcomes(self, t, outcome, ok_all: np.ndarray, failed: np.ndarray) -> np.ndarray:
        """Count each outcome and widen the span of sends and ends; the mask of requests sent."""
        n = self.n
        sent_ns, end_ns = f64(t.column("sent_ns")), f64(t.column("end_ns"))
        was_sent = ~np.isnan(sent_ns)
        if was_sent.any():
            self.sent_min = min(self.sent_min, float(np.nanmin(sent_ns)))
        if (~np.isnan(end_ns)).any():
            self.end_max = max(self.end_max, float(np.nanmax(end_ns)))
        n["scheduled"] += t.num_rows
        n["sent"] += int(was_sent.sum())
        n["completed"] += int(ok_all.sum())
        n["failed"] += int(failed.sum())
        for name in ("cancelled", "not_started", "missed_while_down"):
            n[name] += int(mask(outcome, name).sum())
        return was_sent

    def _add_tokens(self, t, prompt_all: np.ndarray, completion: np.ndarray, ok_all, ok) -> None:
        """Token totals from the server's usage (an unknown total is never 0: the values known
        are counted beside them), the estimates for what it did not report, partial outputs."""
        n, names = self.n, t.schema.names
        n["total_input_tokens"] += nansum(prompt_all[ok_all])
        n["total_output_tokens"] += nansum(completion)
        n["input_tokens_known"] += int((~np.isnan(prompt_all[ok_all])).sum())
        n["input_tokens_values"] += int(ok_all.sum())
        n["output_tokens_known"] += int((~np.isnan(completion)).sum())
        n["output_tokens_values"] += completion.size
        if "output_tokens_estimate" in names:  # (results files written before it existed)
            self.estimate_known = True
            n["output_tokens_estimate"] += nansum(f64(t.column("output_tokens_estimate"))[ok][np.isnan(completion)])
            n["invalid_utf8"] += nansum(f64(t.column("invalid_utf8"))) if "invalid_utf8" in names else 0
        if "partial_output_tokens" in names:  # output of failed/cancelled requests: in no total
            self.partial_known = True
            n["partial_output_tokens"] += nansum(f64(t.column("partial_output_tokens")))

    def _add_latencies(self, t, e2e: np.ndarray, ok_all, ok) -> np.ndarray:
        """TTFT, TPOT, ITL, E2E (and from the due time), the server's own timings; the TTFT of
        the generation requests that succeeded."""
        names = t.schema.names
        for c in SERVER_TIMINGS:
            if c in names and t.column(c).null_count < t.num_rows:
                self.stat(c).add(f64(t.column(c))[ok])
        ttft = f64(t.column("ttft_ms"))[ok]
        self.stat("ttft_ms").add(ttft)
        tpot = f64(t.column("tpot_ms"))[ok]
        self.stat("tpot_ms").add(tpot)
        decode = f64_or_nan(t, "decode_tpot_ms")[ok]  # (issue 47) unknown: left out, and counted
        self.stat("decode_tpot_ms").add(decode)
        self.n["decode_tpot_unknown"] += int((~np.isnan(tpot) & np.isnan(decode)).sum())
        # this batch's ITL samples only: a run's ITL lists are never held whole
        self.stat("itl_ms").add(itl_samples(t, ok))  # (either ITL form: result.compact_itl)
        self.stat("e2el_ms").add(e2e[ok_all])
        if "ttft_from_due_ms" in names:  # the same from the due time, as derive() recorded it
            self.stat("ttft_from_due_ms").add(f64(t.column("ttft_from_due_ms"))[ok])
            self.stat("e2el_from_due_ms").add(f64(t.column("e2el_from_due_ms"))[ok_all])
        return ttft

    def _add_audit(self, t, prompt: np.ndarray, completion: np.ndarray, ttft: np.ndarray, ok) -> None:
        """The usage audit: the server's token counts against the trace's (``core.usage``)."""
        n, mm = self.n, "images" in t.schema.names
        audit = usage.of_columns(
            prompt,
            completion,
            f64(t.column("input_length"))[ok],
            f64(t.column("output_length"))[ok],
            images=f64(t.column("images"))[ok] if mm else None,
            text_tokens=f64(t.column("text_tokens"))[ok] if mm else None,
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

    def _add_sessions(self, t) -> None:
        """Sessions: their ids, turns, turns held for their parent (and the wait), turns lost."""
        sid = pc.drop_null(t.column("session_id"))
        if not len(sid):
            return
        n = self.n
        self.sessions.update(pc.unique(sid).to_pylist())
        n["session_turns"] += len(sid)
        wait = f64(t.column("session_wait_ms"))
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
        sent = f64(t.column("sent_ns"))
        n["warmup_sent"] += int((~np.isnan(sent)).sum())
        n["warmup_completed"] += int(mask(outcome, "success").sum())
        n["warmup_failed"] += int(mask(outcome, "failed").sum())
        if (~np.isnan(sent)).any():
            self.warmup_last_sent = max(self.warmup_last_sent, float(np.nanmax(sent)))
        ok = mask(outcome, "success")
        self.warm_tokens.add(
            f64_or_nan(t, "first_token_ns")[ok],
            f64_or_nan(t, "last_token_ns")[ok],
            f64(t.column("completion_tokens"))[ok],
        )

    def _add_endpoints(self, t, ep, outcome, ok_all: np.ndarray, failed: np.ndarray, e2e: np.ndarray) -> None:
        """Per-endpoint counts and E2E, and the pooling usage audit (``replayer.http.audit``)."""
        kinds = [k for k in pc.unique(ep).to_pylist() if k is not None]
        audit = t.column("usage_audit")
        pooled_rows = ~(mask(outcome, "not_started") | mask(outcome, "cancelled") | mask(outcome, "missed_while_down"))
        for k in kinds:
            mine = mask(ep, k)
            e = self.endpoints.setdefault(k, {"scheduled": 0, "completed": 0, "failed": 0})
            e["scheduled"] += int(mine.sum())
            e["completed"] += int((ok_all & mine).sum())
            e["failed"] += int((failed & mine).sum())
            self.stat(f"e2el_ms {k}").add(e2e[ok_all & mine])
            if k in POOLING and (mine & pooled_rows).any():
                self.pooled = True
                a = self.audit.setdefault(k, {"ok": 0, "inflated": 0, "missing": 0})
                for name in a:
                    c = int((mine & pooled_rows & mask(audit, name)).sum())
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
        self.verdict = add_counts(self.verdict, other.verdict)
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
