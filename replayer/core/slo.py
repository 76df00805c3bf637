"""The SLO bounds (``--goodput``) and one request judged against them: the rule every stage
shares (the config parses the bounds, the run judges each result as it arrives, the metrics
count the codes, the summary folds whole columns with ``replayer.results.verdict.judge``).

Bounds follow ``vllm bench serve --goodput``: ``KEY:VALUE`` pairs, keys ``ttft``, ``tpot``,
``e2el``, values in milliseconds; a value meets its bound when ``value <= bound``. The per-request
rule is in ``replayer.results.verdict``'s docstring. Latency from the due time is not computed
here: ``replayer.core.timestamps.derive`` does it once, as the request is measured.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: the bounds ``--goodput`` takes (vllm bench serve's keys), in this order everywhere
SLO_NAMES = ("ttft", "tpot", "e2el")
#: per-request verdict codes (int8 arrays)
MET, MISSED, UNKNOWN, NOT_JUDGED = 1, 0, -1, -2
#: verdict code -> ``result`` label of ``replayer_slo_requests_total`` (not-judged requests are not counted)
RESULT_LABELS = {MET: "met", MISSED: "missed", UNKNOWN: "unknown"}


def parse_goodput(pairs: Iterable[str] | str | None) -> dict[str, float]:
    """``["ttft:2000", "tpot:50"]`` (or one string of pairs separated by spaces or commas) -> ``{"ttft": 2000.0,
    "tpot": 50.0}`` in milliseconds, ordered as ``SLO_NAMES``; ``{}`` for None. Raises ValueError
    naming the bad pair (format ``KEY:VALUE``, key one of ``SLO_NAMES``, value a number >= 0, each
    key once)."""
    if pairs is None:
        return {}
    if isinstance(pairs, str):
        pairs = pairs.replace(",", " ").split()
    out: dict[str, float] = {}
    for pair in pairs:
        key, sep, value = str(pair).partition(":")
        key = key.strip()
        if not sep:
            raise ValueError(
                f"{pair!r} is not KEY:VALUE (e.g. ttft:2000 tpot:50 e2el:30000, or ttft:2000,tpot:50; milliseconds)"
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


def judge_result(res: Any, slos: dict[str, float]) -> dict[str, int] | None:
    """Judge a ``RequestResult`` against ``slos``: set its ``slo_met`` (True, False, or None when
    unknown or not judged) and return ``judge_one``'s codes; None (and nothing set) without
    bounds. Reads the latencies measured from the send."""
    if not slos:
        return None
    codes = judge_one(res.outcome, res.ttft_ms, res.tpot_ms, res.e2e_ms, res.completion_tokens, slos)
    c = codes["all"]
    res.slo_met = True if c == MET else False if c == MISSED else None
    return codes
