"""The verdict: SLO bounds (``--goodput``), each request judged against them, goodput and
attainment, and latency from the due time. Pure functions over per-request columns (numpy
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

from collections.abc import Iterable
from typing import Any

import numpy as np

from replayer.core.timestamps import since_due_ms

#: the bounds ``--goodput`` takes (vllm bench serve's keys), in this order everywhere
SLO_NAMES = ("ttft", "tpot", "e2el")
#: per-request verdict codes (int8 arrays)
MET, MISSED, UNKNOWN, NOT_JUDGED = 1, 0, -1, -2
#: verdict code -> ``result`` label of ``replayer_slo_requests_total`` (not-judged requests are not counted)
RESULT_LABELS = {MET: "met", MISSED: "missed", UNKNOWN: "unknown"}


def parse_goodput(pairs: Iterable[str] | str | None) -> dict[str, float]:
    """``["ttft:2000", "tpot:50"]`` (or one string of space-separated pairs) -> ``{"ttft": 2000.0,
    "tpot": 50.0}`` in milliseconds, ordered as ``SLO_NAMES``; ``{}`` for None. Raises ValueError
    naming the bad pair (format ``KEY:VALUE``, key one of ``SLO_NAMES``, value a number >= 0, each
    key once)."""
    if pairs is None:
        return {}
    if isinstance(pairs, str):
        pairs = pairs.split()
    out: dict[str, float] = {}
    for pair in pairs:
        key, sep, value = str(pair).partition(":")
        key = key.strip()
        if not sep:
            raise ValueError(
                f"{pair!r} is not KEY:VALUE (e.g. ttft:2000 tpot:50 e2el:30000, milliseconds; "
                "a trace path goes before --goodput, or after '--')"
            )
        if key not in SLO_NAMES:
            raise ValueError(f"{pair!r}: unknown key {key!r}; keys are {', '.join(SLO_NAMES)}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"{pair!r}: {value!r} is not a number of milliseconds") from None
        if not ms >= 0 or ms == float("inf"):
            raise ValueError(f"{pair!r}: the bound must be a finite number of milliseconds >= 0")
        if key in out:
            raise ValueError(f"{pair!r}: {key} is given twice")
        out[key] = ms
    return {k: out[k] for k in SLO_NAMES if k in out}


def format_goodput(slos: dict[str, float]) -> list[str]:
    """The ``--goodput`` pairs of ``slos`` (inverse of ``parse_goodput``)."""
    return [f"{k}:{v:g}" for k, v in slos.items()]


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


def judge_one(
    outcome: str,
    ttft_ms: float | None,
    tpot_ms: float | None,
    e2el_ms: float | None,
    completion_tokens: int | None,
    slos: dict[str, float],
) -> dict[str, int]:
    """``judge`` of one request, in plain Python: the same rule, for the daemon's per-request path
    (~2 us where ``judge`` on one-element arrays takes ~300 us; a test holds the two equal)."""
    if outcome != "success":
        code = MISSED if outcome == "failed" else NOT_JUDGED
        return {**{name: code for name in slos}, "all": code}
    if completion_tokens is not None and completion_tokens <= 1:
        tpot_ms = 0.0
    values = {"ttft": ttft_ms, "tpot": tpot_ms, "e2el": e2el_ms}
    out = {}
    for name, bound in slos.items():
        v = values[name]
        out[name] = UNKNOWN if v is None or v != v else MET if v <= bound else MISSED
    codes = out.values()
    out["all"] = MISSED if MISSED in codes else UNKNOWN if UNKNOWN in codes else MET
    return out


def apply(res: Any, slos: dict[str, float]) -> dict[str, int] | None:
    """Fill a ``RequestResult``'s derived verdict fields: ``ttft_from_due_ms`` and
    ``e2el_from_due_ms`` (``from_due_ms``; None where unknown), and, with bounds, ``slo_met``
    (True, False, or None when unknown or not judged). Returns ``judge_one``'s codes (None
    without bounds)."""
    since_due = since_due_ms(res.sent_ns, res.due_ns, res.session_wait_ms)
    if since_due is not None:
        if res.ttft_ms is not None:
            res.ttft_from_due_ms = res.ttft_ms + since_due
        if res.e2e_ms is not None:
            res.e2el_from_due_ms = res.e2e_ms + since_due
    if not slos:
        return None
    codes = judge_one(res.outcome, res.ttft_ms, res.tpot_ms, res.e2e_ms, res.completion_tokens, slos)
    c = codes["all"]
    res.slo_met = True if c == MET else False if c == MISSED else None
    return codes


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


#: ``fold``'s keys: sums over requests, merged by adding (``summary._add``)
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


def from_due_ms(value_ms: Any, sent_ns: Any, due_ns: Any, session_wait_ms: Any) -> np.ndarray:
    """Latency from the due time (coordinated-omission-free, wrk2's corrected view): ``value_ms``
    (TTFT or E2E, measured from the send) plus the time from the due time to the send, in ms.
    For a session turn held back behind its predecessor, "due" is its release (due +
    ``session_wait_ms``): the hold is the server's earlier slowness, reported apart. ``sent_ns``
    is the (last) attempt's send, so a retried request's earlier attempts count too. NaN where
    ``value_ms`` or ``sent_ns`` is unknown."""
    wait = _f(session_wait_ms)
    out: np.ndarray = _f(value_ms) + (_f(sent_ns) - _f(due_ns)) / 1e6 - np.where(np.isnan(wait), 0.0, wait)
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
