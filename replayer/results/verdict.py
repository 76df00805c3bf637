"""The verdict: SLO bounds (``--goodput``), each request judged against them, goodput and
attainment, folded over whole columns (the per-request rule and the bounds themselves are
``replayer.core.slo``'s). Pure functions over per-request columns (numpy
arrays), so the daemon (one request at a time), the summary and a streaming fold share them.

Bounds follow ``vllm bench serve --goodput``: ``KEY:VALUE`` pairs, keys ``ttft``, ``tpot``,
``e2el``, values in milliseconds. A value meets its bound when ``value <= bound`` (as vLLM
compares). A request meets the SLO when it succeeded and every named bound holds.

Per bound, a request is:

- ``met`` / ``missed``: succeeded and its value is <= / > the bound;
- ``missed`` whatever its values when it failed (a failure never meets an SLO);
- ``unknown`` when it succeeded but the value was not measured (no first token for TTFT; no
  TPOT and no server usage saying N <= 1, e.g. one event and no usage). TPOT of a request the
  server says produced 0 or 1 completion tokens has no time per output token after the first:
  it meets the TPOT bound, as vLLM regards such a TPOT as 0 for goodput;
- not judged when it was cancelled at shutdown or never started (not the server's doing).

Over all bounds (``all``): missed if any bound is missed, else unknown if any is unknown, else met.
Attainment is met / (met + missed): the requests judged, failed ones counted as missed and
unknown ones left out (``slo_unknown`` counts them). Goodput divides by the run's duration.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# the per-request rule and the bounds, re-exported: the verdict's names in one place
from replayer.core.slo import (
    MET as MET,
    MISSED as MISSED,
    NOT_JUDGED as NOT_JUDGED,
    RESULT_LABELS as RESULT_LABELS,
    SLO_NAMES as SLO_NAMES,
    UNKNOWN as UNKNOWN,
    format_goodput as format_goodput,
    judge_one as judge_one,
    judge_result as judge_result,
    parse_goodput as parse_goodput,
)


def _f(values: Any) -> np.ndarray:
    """A float64 array of ``values`` (None -> NaN)."""
    a = np.asarray(values, dtype=object if not isinstance(values, np.ndarray) else None)
    if a.dtype == object:
        a = np.array([np.nan if v is None else v for v in a.tolist()], dtype=np.float64)
    out: np.ndarray = a.astype(np.float64, copy=False)
    return out


def judge(
    outcome: Any, ttft_ms: Any, tpot_ms: Any, e2el_ms: Any, completion_tokens: Any, slos: dict[str, float]
) -> dict[str, np.ndarray]:
    """Per-request verdict codes (``MET``, ``MISSED``, ``UNKNOWN``, ``NOT_JUDGED``; int8 arrays) for
    each bound in ``slos`` and for ``all`` of them. Arguments are per-request columns of one length:
    ``outcome`` strings (``replayer.core.errors.Outcome`` values), latencies in ms and server-reported
    completion tokens (None/NaN where unknown). ``slos``: ``parse_goodput``'s dict (non-empty)."""
    outcome = np.asarray(outcome, dtype=object)
    ok = outcome == "success"
    judged = ok | (outcome == "failed")
    tokens = _f(completion_tokens)
    tpot = _f(tpot_ms)
    values = {"ttft": _f(ttft_ms), "tpot": np.where(tokens <= 1, 0.0, tpot), "e2el": _f(e2el_ms)}
    out: dict[str, np.ndarray] = {}
    any_missed = np.zeros(outcome.shape, dtype=bool)
    any_unknown = np.zeros(outcome.shape, dtype=bool)
    for name, bound in slos.items():
        v = values[name]
        code = np.full(outcome.shape, NOT_JUDGED, dtype=np.int8)
        code[judged] = MISSED
        code[ok & (v <= bound)] = MET
        code[ok & np.isnan(v)] = UNKNOWN
        any_missed |= code == MISSED
        any_unknown |= code == UNKNOWN
        out[name] = code
    code = np.full(outcome.shape, NOT_JUDGED, dtype=np.int8)
    code[judged] = MET
    code[judged & any_unknown] = UNKNOWN
    code[judged & any_missed] = MISSED
    out["all"] = code
    return out


def slo_met(codes: np.ndarray) -> list[bool | None]:
    """The per-request ``slo_met`` column from ``judge(...)["all"]``: True, False, or None (unknown,
    or not judged)."""
    return [True if c == MET else False if c == MISSED else None for c in codes.tolist()]


def fold(codes: dict[str, np.ndarray], completion_tokens: Any) -> dict[str, Any]:
    """Counts of ``judge``'s codes, additive across batches, shards and runs: ``slo_met``,
    ``slo_missed``, ``slo_unknown`` (all bounds), ``slo_requests`` ({bound or "all": {met, missed,
    unknown}}) and ``goodput_output_tokens`` (server-reported completion tokens of the requests
    meeting every bound)."""
    counts = {
        name: {label: int((c == code).sum()) for code, label in RESULT_LABELS.items()} for name, c in codes.items()
    }
    tokens = _f(completion_tokens)[codes["all"] == MET]
    a = counts["all"]
    return {
        "slo_met": a["met"],
        "slo_missed": a["missed"],
        "slo_unknown": a["unknown"],
        "slo_requests": counts,
        "goodput_output_tokens": int(np.nansum(tokens)),
    }


#: ``fold``'s keys: sums over requests, merged by adding (``foldcolumns.add_counts``)
ADDITIVE = ("slo_met", "slo_missed", "slo_unknown", "slo_requests", "goodput_output_tokens")


def _ratio(met: int, missed: int) -> float | None:
    return met / (met + missed) if met + missed else None


def finish(counts: dict[str, Any], slos: dict[str, float], duration_s: float) -> dict[str, Any]:
    """Summary fields from ``fold``'s ``counts`` (merged) and the run's ``duration_s``:
    ``goodput_slos_ms`` (the bounds), ``request_goodput`` (requests/s meeting every bound, vllm's
    name), ``output_token_goodput`` (their output tokens/s), ``slo_attainment`` and
    ``slo_attainment_<bound>`` (met / (met + missed), 0..1; None when nothing was judged), and the
    counts themselves. Rates are None when ``duration_s`` is not > 0."""
    per = counts["slo_requests"]
    out = {
        "goodput_slos_ms": dict(slos),
        "request_goodput": counts["slo_met"] / duration_s if duration_s > 0 else None,
        "output_token_goodput": counts["goodput_output_tokens"] / duration_s if duration_s > 0 else None,
        "slo_attainment": _ratio(counts["slo_met"], counts["slo_missed"]),
    }
    for name in slos:
        c = per.get(name, {})
        out[f"slo_attainment_{name}"] = _ratio(c.get("met", 0), c.get("missed", 0))
    out.update({k: counts[k] for k in ADDITIVE})
    return out


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.2f}%"


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.2f}"


def verdict_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The verdict of a summary as (label, text) rows, to show first (printed summary, HTML
    report); [] when it has no ``--goodput`` bounds."""
    slos = summary.get("goodput_slos_ms")
    if not slos:
        return []
    per = summary.get("slo_requests") or {}

    def attained(key: str, counts: dict[str, int]) -> str:
        met, missed = counts.get("met", 0), counts.get("missed", 0)
        return f"{_pct(summary.get(key))} ({met:,} met of {met + missed:,} judged)"

    rows = [
        ("SLO bounds (ms)", " ".join(f"{k}<={v:g}" for k, v in slos.items())),
        ("SLO attainment (every bound)", attained("slo_attainment", per.get("all", {}))),
    ]
    rows += [(f"  {name} attainment", attained(f"slo_attainment_{name}", per.get(name, {}))) for name in slos]
    rows += [
        ("Unknown (left out of attainment)", f"{summary.get('slo_unknown', 0):,}"),
        ("Request goodput (req/s)", _num(summary.get("request_goodput"))),
        ("Output token goodput (tok/s)", _num(summary.get("output_token_goodput"))),
    ]
    return rows
