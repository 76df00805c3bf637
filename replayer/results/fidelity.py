"""The fidelity verdict: did the run send the trace's arrivals (``summary.json``'s ``fidelity``)?

A replay that fell behind, was capped or lost requests measured another workload. The verdict
is ``faithful``, ``not_faithful`` (with its reasons) or ``not_judged`` (too few requests sent),
from these figures of the requests sent (warm-up left out):

- **dispatch lag** (send - due, from a held turn's release) p99 and max; p99 above the bound
  (``--fidelity-max-lag``) is not faithful (the max is reported: one pause is not a pattern);
- **inter-arrivals**: the gaps between consecutive sends against the trace's gaps at the run's
  speed-up (the due times, a session turn's moved to its release: that wait is the trace's own
  dependency), each gap snapped to the grid of ``fidelitygaps`` (1 ms: traces stamp in ms, a
  burst of equal stamps is gaps of 0, which a sender can only approach; 1 % steps above 1,024
  ms), compared by quantile deltas at p10/p50/p90/p99 and by the two-sample Kolmogorov-Smirnov
  distance, both from the gaps' histograms on that grid. Not faithful when the
  distance is above both ``max_ks`` (an effect large enough to matter) and the critical value
  at ``alpha`` (not noise of a small run): a significance test alone would fail a million-
  request run on a harmless 0.1 ms jitter;
- **rows**: the trace's rows in the window, scheduled, sent; rows scheduled and never sent (not
  started, missed while down) make a run that was not stopped not faithful;
- **held back**: by ``--max-concurrency`` (a request that waited for a slot longer than the lag
  bound: the trace's arrivals were not sent, not faithful, the cap named) and by sessions
  waiting for their parent (the trace's own dependency: faithful, and said);
- **lengths**: prompt and output tokens as sent against the trace (a share above
  ``max_length_mismatch`` differing is not faithful);
- **affinity**: with several targets, turns sent to another target than their session's.

``FidelityFold`` folds results batch by batch (the inter-arrivals of the first
``ARRIVALS_LIMIT`` sent requests), and merges: with the digest of the results files retention
removed (``fidelitydigest``), and fold with fold (the folders of a merge); ``judge_fidelity`` is
the rule over the figures, used by the summary and by the live watch
(``replayer.results.verdictwatch``, without inter-arrivals).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replayer.core.stats import RELATIVE_ACCURACY, Stat
from replayer.results.fidelitygaps import (
    GAP_LINEAR_MS,
    GAP_RELATIVE_STEP,
    GAP_RESOLUTION_MS,
    GapStream,
    Hist,
    hist_add,
    hist_ks,
    hist_of,
    hist_percentile,
)
from replayer.results.numtext import count, plain
from replayer.results.trend import ks_critical

#: the inter-arrivals are those of the first this many sent requests (memory: 16 bytes each)
ARRIVALS_LIMIT = 2_000_000
#: fewer requests sent than this: not judged
MIN_SENT = 10
#: the quantiles of the inter-arrival comparison
GAP_QUANTILES = (10, 50, 90, 99)
#: the results columns the fold reads
COLUMNS = (
    "due_ns",
    "sent_ns",
    "outcome",
    "warmup",
    "dispatch_lag_ms",
    "queue_wait_ms",
    "session_wait_ms",
    "input_length",
    "prompt_len_sent",
    "output_length",
    "max_tokens",
)


@dataclass(frozen=True)
class FidelityBounds:
    """What a faithful run stays within (module docstring)."""

    max_lag_ms: float = 25.0
    max_ks: float = 0.1
    alpha: float = 0.001
    max_length_mismatch: float = 0.01


def _f64(col: Any) -> np.ndarray:
    return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)


class FidelityFold:
    """The figures of the fidelity verdict, folded from results batches (``COLUMNS``)."""

    def __init__(self) -> None:
        self.lag = Stat()
        self.n = dict.fromkeys(
            ("rows", "sent", "unsent", "queue_waited", "queue_held", "session_waited", "prompt_off", "output_off"), 0
        )
        self.n["lengths"] = 0
        self._due: list[np.ndarray] = []
        self._sent: list[np.ndarray] = []
        self._kept = 0
        #: the gap streams of removed files (due, sent; absolute ns), set with ``seed_streams``
        self._streams: tuple[GapStream, GapStream] | None = None
        self._origin_ns = 0
        #: gap histograms (trace, achieved) and sends of the segments sealed (``seal``)
        self._sealed: list[tuple[Hist, Hist, int]] = []
        #: what the figures owe to the digest of removed files (``fidelitydigest``), None: nothing
        self.removed: dict[str, Any] | None = None

    def add(self, b: pa.RecordBatch | pa.Table, *, lag_bound_ms: float = FidelityBounds.max_lag_ms) -> None:
        names = b.schema.names
        if "warmup" in names:
            b = b.filter(pc.invert(pc.fill_null(b.column("warmup"), False)))
        outcome = b.column("outcome")
        unsent = pc.is_in(outcome, pa.array(["not_started", "missed_while_down"])).to_numpy(zero_copy_only=False)
        sent_ns = _f64(b.column("sent_ns"))
        sent = ~np.isnan(sent_ns)
        self.n["rows"] += b.num_rows
        self.n["unsent"] += int(unsent.sum())
        self.n["sent"] += int(sent.sum())
        if not sent.any():
            return
        self.lag.add(_f64(b.column("dispatch_lag_ms"))[sent])
        zero = np.zeros(b.num_rows)
        queue = np.nan_to_num(_f64(b.column("queue_wait_ms"))) if "queue_wait_ms" in names else zero
        session = np.nan_to_num(_f64(b.column("session_wait_ms"))) if "session_wait_ms" in names else zero
        self.n["queue_waited"] += int((queue[sent] > 0).sum())
        self.n["queue_held"] += int((queue[sent] > lag_bound_ms).sum())
        self.n["session_waited"] += int((session[sent] > 0).sum())
        self._lengths(b, sent)
        if self._kept < ARRIVALS_LIMIT:
            take = np.flatnonzero(sent)[: ARRIVALS_LIMIT - self._kept]
            due = _f64(b.column("due_ns"))[take] + session[take] * 1e6
            self._due.append(due)
            self._sent.append(sent_ns[take])
            self._kept += take.size

    def _lengths(self, b: pa.RecordBatch | pa.Table, sent: np.ndarray) -> None:
        names = b.schema.names
        if not {"input_length", "prompt_len_sent", "output_length", "max_tokens"} <= set(names):
            return
        inp, psent = _f64(b.column("input_length"))[sent], _f64(b.column("prompt_len_sent"))[sent]
        out, mt = _f64(b.column("output_length"))[sent], _f64(b.column("max_tokens"))[sent]
        judged = inp > 0  # (pooling rows and synthetic rows without a length: not judged)
        self.n["lengths"] += int(judged.sum())
        self.n["prompt_off"] += int((judged & (inp != psent)).sum())
        self.n["output_off"] += int((judged & (out > 0) & (out != mt)).sum())

    def seed_streams(self, due: GapStream, sent: GapStream, origin_ns: int) -> None:
        """Continue the gap streams of removed files (``fidelitydigest``): the times added here
        are ``origin_ns`` (Unix ns) less than the streams' (the axis of the files read)."""
        self._streams, self._origin_ns = (due, sent), origin_ns

    def times(self) -> tuple[np.ndarray, np.ndarray]:
        """The due times (a session turn's at its release) and the send times of the sent
        requests kept for the inter-arrivals, sorted, int64 ns."""
        if not self._kept:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        due = np.rint(np.concatenate(self._due)).astype(np.int64)
        sent = np.rint(np.concatenate(self._sent)).astype(np.int64)
        return np.sort(due), np.sort(sent)

    def seal(self) -> None:
        """Close this fold's sequence of sends: its gaps (with the streams of removed files, if
        seeded) into histograms; results added later start a new sequence."""
        if not self._kept and self._streams is None:
            return
        due, sent = self.times()
        if self._streams is None:
            self._sealed.append((hist_of(due), hist_of(sent), int(sent.size)))
        else:
            sd, ss = self._streams
            want, got = sd.finish(due + self._origin_ns), ss.finish(sent + self._origin_ns)
            self._sealed.append((want, got, ss.n))
            if self.removed is not None:
                late = self.removed.setdefault("late", {"trace": 0, "achieved": 0})
                late["trace"] += sd.late
                late["achieved"] += ss.late
            self._streams = None
        self._due, self._sent, self._kept = [], [], 0

    def merge(self, other: FidelityFold) -> None:
        """Add ``other``'s figures (another folder's): counts and lags as one run; the
        inter-arrivals of each fold are its own sends' (each sealed)."""
        self.seal()
        other.seal()
        for k, v in other.n.items():
            self.n[k] += v
        self.lag.merge(other.lag)
        self._sealed += other._sealed
        if other.removed is not None:
            mine = self.removed or {
                "files": 0,
                "requests": 0,
                "late": {"trace": 0, "achieved": 0},
                "lag_bound_ms": other.removed.get("lag_bound_ms"),
            }
            for k in ("files", "requests"):
                mine[k] += other.removed.get(k, 0)
            for k in ("trace", "achieved"):
                mine["late"][k] += other.removed.get("late", {}).get(k, 0)
            self.removed = mine

    def arrivals(self) -> dict[str, Any] | None:
        """The inter-arrival comparison (module docstring); None with fewer than 3 sends."""
        self.seal()
        requests = sum(s[2] for s in self._sealed)
        if requests < 3:
            return None
        want, got = hist_add(*(s[0] for s in self._sealed)), hist_add(*(s[1] for s in self._sealed))
        nw, ng = int(want[1].sum()), int(got[1].sum())
        if not nw or not ng:
            return None
        out: dict[str, Any] = {
            "requests": requests,
            "resolution_ms": GAP_RESOLUTION_MS,
            "relative_step": GAP_RELATIVE_STEP,
            "relative_step_above_ms": GAP_LINEAR_MS * GAP_RESOLUTION_MS,
        }
        for q in GAP_QUANTILES:
            tq, aq = hist_percentile(want, q), hist_percentile(got, q)
            out[f"p{q}"] = {"trace_ms": tq, "achieved_ms": aq, "delta_ms": aq - tq}
        out["ks_distance"] = hist_ks(want, got)
        out["ks_critical"] = ks_critical(nw, ng)
        return out

    def figures(self) -> dict[str, Any]:
        """Everything ``judge_fidelity`` reads, JSON-able."""
        n = self.n
        arrivals = self.arrivals()  # (first: it seals, which counts the late sends of removed files)
        out = count_figures(n, self.lag, n["lengths"], arrivals)
        if self.removed is not None:
            out["from_digest"] = self._from_digest()
        return out

    def _from_digest(self) -> dict[str, Any]:
        """Which figures come from the digest of removed results files, and how precise."""
        r = self.removed or {}
        late = r.get("late") or {"trace": 0, "achieved": 0}
        return {
            "files": r.get("files", 0),
            "requests": r.get("requests", 0),
            "counts": "exact (summed)",
            "dispatch_lag_ms": {
                "p99": f"DDSketch merged with the files kept: within {RELATIVE_ACCURACY:.1%} relative",
                "max": "exact",
            },
            "inter_arrival": {
                "estimate": "gap histograms on the comparison's grid, merged: quantiles and KS distance exact on it",
                "late": late,
                "approximate": bool(late["trace"] or late["achieved"]),
                "per_folder": bool(r.get("per_folder")),
            },
            "max_concurrency_bound_ms": r.get("lag_bound_ms"),
        }


def count_figures(n: dict[str, Any], lag: Stat, judged: int, inter_arrival: dict[str, Any] | None) -> dict[str, Any]:
    """The figures ``judge_fidelity`` reads, from a fold's counts ``n`` (rows, sent, unsent, the
    requests the cap and sessions held back, lengths that differ), its dispatch lag and the
    inter-arrival comparison (None: not compared, as live)."""
    sent = n["sent"]
    return {
        "rows": n["rows"],
        "sent": sent,
        "unsent": n["unsent"],
        "dispatch_lag_ms": {"p99": lag.percentile(99), "max": lag.max if lag.count else None},
        "inter_arrival": inter_arrival,
        "held_back": {
            "max_concurrency": n["queue_waited"],
            "max_concurrency_beyond_bound": n["queue_held"],
            "max_concurrency_share": n["queue_waited"] / sent if sent else None,
            "sessions": n["session_waited"],
            "sessions_share": n["session_waited"] / sent if sent else None,
        },
        "lengths": {"judged": judged, "prompt_differs": n["prompt_off"], "output_differs": n["output_off"]},
    }


def judge_fidelity(
    fig: dict[str, Any],
    bounds: FidelityBounds = FidelityBounds(),
    *,
    max_concurrency: int | None = None,
    stopped_early: bool = False,
    target_switches: int | None = None,
) -> dict[str, Any]:
    """The ``fidelity`` section: ``verdict``, ``reasons`` (why not faithful), ``notes`` (what was
    held back and is faithful), the bounds and the figures."""
    reasons: list[str] = []
    notes: list[str] = []
    sent = fig.get("sent") or 0
    section: dict[str, Any] = {"bounds": {"max_lag_ms": bounds.max_lag_ms, "max_ks": bounds.max_ks}, **fig}
    if sent < MIN_SENT:
        why = f"{count(sent, 'request')} sent, fewer than the {MIN_SENT} needed"
        return {"verdict": "not_judged", "reasons": [why], **section}
    p99 = (fig.get("dispatch_lag_ms") or {}).get("p99")
    if p99 is not None and p99 > bounds.max_lag_ms:
        reasons.append(f"dispatch lag p99 {p99:,.1f} ms above the bound {plain(bounds.max_lag_ms)} ms")
    ia = fig.get("inter_arrival")
    if ia and ia.get("ks_distance") is not None:
        d, crit = ia["ks_distance"], ia["ks_critical"]
        if d > bounds.max_ks and d > crit:
            reasons.append(
                f"inter-arrivals differ from the trace's (KS distance {d:.3f} > {max(bounds.max_ks, crit):.3f})"
            )
    held = fig.get("held_back") or {}
    if held.get("max_concurrency_beyond_bound"):
        cap = f"--max-concurrency {max_concurrency}" if max_concurrency is not None else "--max-concurrency"
        reasons.append(
            f"{cap} held back {count(held['max_concurrency'], 'request')} ({held['max_concurrency_share']:.1%}): "
            "the trace's arrivals were not sent"
        )
    if held.get("sessions"):
        notes.append(
            f"{count(held['sessions'], 'session turn')} ({held['sessions_share']:.1%}) waited for their parent: "
            "the trace's own dependency (faithful)"
        )
    if fig.get("from_digest"):
        notes.append(digest_note(fig["from_digest"]))
    if fig.get("unsent"):
        (notes if stopped_early else reasons).append(
            f"{count(fig['unsent'], 'row')} scheduled {'was' if fig['unsent'] == 1 else 'were'} never sent"
            + ("; the run was stopped" if stopped_early else "")
        )
    lengths = fig.get("lengths") or {}
    judged = lengths.get("judged") or 0
    for key, what in (("prompt_differs", "prompt"), ("output_differs", "output")):
        off = lengths.get(key) or 0
        if judged and off / judged > bounds.max_length_mismatch:
            reasons.append(
                f"{off:,} of {count(judged, 'request')} ({off / judged:.1%}) sent another {what} length than the trace's"
            )
    if target_switches is not None:
        section["affinity_held"] = target_switches == 0
        if target_switches:
            reasons.append(f"{count(target_switches, 'session turn')} went to another target than their session's")
    verdict = "not_faithful" if reasons else "faithful"
    return {"verdict": verdict, "reasons": reasons, "notes": notes, **section}


def digest_note(dig: dict[str, Any]) -> str:
    """The verdict's note on the figures that come from the digest of removed results files."""
    ia = dig.get("inter_arrival") or {}
    late = ia.get("late") or {}
    text = (
        f"{dig.get('files', 0)} results files retention removed ({dig.get('requests', 0)} requests sent) "
        f"judged from their digest: counts exact, dispatch lag p99 within {RELATIVE_ACCURACY:.1%} (a sketch)"
    )
    if ia.get("approximate"):
        text += (
            f", inter-arrivals approximate ({late.get('trace', 0)} due and {late.get('achieved', 0)} send times "
            "recorded after their place in the digest was folded, left out)"
        )
    else:
        text += ", inter-arrivals exact on their grid"
    if ia.get("per_folder"):
        text += "; inter-arrivals are each folder's own sends"
    return text


#: the verdicts whose reasons are printed, and the word each reason line starts with
_REASON_HEADS = {"not_faithful": "not faithful", "not_judged": "not judged"}


def fidelity_lines(sec: dict[str, Any] | None) -> list[str]:
    """The verdict as printed at the end of a run: one line, and one per reason or note."""
    if not sec:
        return []
    lag = sec.get("dispatch_lag_ms") or {}
    p99 = lag.get("p99")
    ks = (sec.get("inter_arrival") or {}).get("ks_distance")
    head = f"Fidelity: {sec['verdict'].replace('_', ' ')}"
    figs = []
    if p99 is not None:
        figs.append(f"dispatch lag p99 {p99:,.1f} ms")
    if ks is not None:
        figs.append(f"inter-arrival KS {ks:.3f}")
    if figs:
        head += " (" + ", ".join(figs) + ")"
    return (
        [head]
        + [f"  {head_word}: {r}" for r in sec.get("reasons", []) if (head_word := _REASON_HEADS.get(sec["verdict"]))]
        + [f"  {n}" for n in sec.get("notes", [])]
    )


__all__ = ["COLUMNS", "FidelityBounds", "FidelityFold", "digest_note", "fidelity_lines", "judge_fidelity"]
