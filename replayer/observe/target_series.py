"""The target's Prometheus exposition text -> the known series, combined (pure, no I/O).

The names read are an engine's dialect (``replayer.observe.dialects``: vLLM's by default, or
SGLang's, TGI's, TensorRT-LLM's, Dynamo's, llama.cpp's), each read as replayer's canonical
names. ``parse_series(text, dialect)`` picks the known series out of one exposition text;
``aggregate(series, dialect=)`` combines them into flat values; ``parse_metrics(text, dialect)``
does both (``parse_vllm_metrics`` in vLLM's); ``series_deltas(before,
after)`` gives per-series increases with counter resets handled. ``replayer.observe.target_metrics``
scrapes the text and keeps the run's totals with these.

Rules (shared/cases/client-faults.md):

* Samples are chosen by **exact sample name** (``vllm:prompt_tokens_total``), never by prefix.
  The text parser strips ``_total`` from a counter's *family* name (B23), so matching is done on
  sample names, which keep it. ``X_created`` samples (the counter's creation time, Unix s, ~1.7e9)
  are never values (B03); they are kept apart and used only to detect resets (B20). Histograms
  contribute only their exact ``_sum``/``_count`` samples.
* Series are combined with ONE explicit keyed sum: the key is the canonical name plus the KEPT
  labels (``position`` for the per-position acceptance counter); every other label (``engine``,
  ``dp_rank``, ``pod``, ``instance``, ``model_name``, ``finished_reason``...) is summed over
  (B19). One target serves one model in a replay, so ``model_name`` is summed; the raw series in
  ``TargetScraper.samples`` keep every label for an offline breakdown. The result does not depend
  on line order. ``kv_cache_usage_perc`` is a fraction per engine: its aggregate is the mean over
  series, not the sum.
* A counter series that decreases, or whose ``_created`` changed, was reset (server restart): its
  increase over that interval is its new value, not a negative difference (B20). Resets are found
  per raw series (per engine) *before* summing, so one engine's reset cannot hide behind another
  engine's growth.
* A known metric the target does not report is left out, never 0: the first good scrape logs the
  missing ones by name (one warning line), and ``TargetScraper.missing`` lists those no scrape of
  the run has had (``target_metrics.missing`` in the summary). A counter reset is logged when
  the scrape that sees it arrives.
* Derived values: ``spec_decode_acceptance_rate`` = accepted / draft tokens;
  ``spec_decode_mean_acceptance_length`` = 1 + accepted / drafts;
  ``spec_decode_acceptance_rate_per_pos{position="k"}`` = accepted at k (summed over engines) /
  drafts (B03, B19); ``prefix_cache_hit_rate`` = hits / queries; ``server_mean_ttft_seconds``,
  ``server_mean_itl_seconds`` etc.
  = ``_sum / _count``. A ratio with a zero or missing denominator is left out (never 0, never NaN).

Metric names: vLLM V1 ``vllm/v1/metrics/loggers.py`` (``vllm:prefix_cache_queries``/``hits``,
``vllm:kv_cache_usage_perc``, ``vllm:spec_decode_*``); the older names ``vllm:gpu_prefix_cache_*``
and ``vllm:gpu_cache_usage_perc`` are accepted when the new ones are absent (never both summed).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

from replayer.observe.dialects import Dialect, dialect
from replayer.observe.dialects.base import KEPT_LABELS, MEAN_GAUGES

VLLM = dialect("vllm")

__all__ = [
    "COUNTERS",
    "GAUGES",
    "CANON",
    "SeriesKey",
    "parse_series",
    "aggregate",
    "parse_vllm_metrics",
    "parse_metrics",
    "VLLM",
    "series_deltas",
    "is_reset",
    "check_invariants",
]

#: vLLM's tables (the default dialect): canonical name -> accepted sample names, preferred first
COUNTERS: dict[str, tuple[str, ...]] = dict(VLLM.counters)
GAUGES: dict[str, tuple[str, ...]] = dict(VLLM.gauges)
CANON: dict[str, tuple[str, str, int]] = {n: (r[0].canon, r[0].kind, r[0].rank) for n, r in VLLM.rules.items()}

#: (sample name, sorted (label, value) pairs) identifying one raw series
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


def parse_series(text: str, dialect: Dialect = VLLM) -> tuple[dict[SeriesKey, float], dict[SeriesKey, float]]:
    """The known series of one ``/metrics`` text, read in the engine's ``dialect``.

    Returns ``(values, created)``: ``values`` maps each raw series of a known sample name (see
    ``dialect.rules``; a sample narrowed to a label value counts only with it) to its value;
    ``created`` maps the counter series that have a
    ``_created`` companion to that creation time (Unix s). Unknown samples are ignored; NaN
    values are dropped. Raises ``ValueError`` for text the Prometheus parser rejects.
    """
    values: dict[SeriesKey, float] = {}
    created: dict[SeriesKey, float] = {}
    rules, made = dialect.rules, dialect.created
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            if name in rules:
                if dialect.canonical(name, s.labels) is None:
                    continue
                target = values
            elif name in made:
                name = made[name]
                target = created
            else:
                continue
            v = float(s.value)
            if math.isnan(v):
                continue
            target[(name, tuple(sorted(s.labels.items())))] = v
    return values, created


def _agg_key(canon: str, labels: tuple[tuple[str, str], ...]) -> str:
    kept = KEPT_LABELS.get(canon)
    if not kept:
        return canon
    d = dict(labels)
    return canon + "{" + ",".join(f'{k}="{d.get(k, "")}"' for k in kept) + "}"


def aggregate(values: Mapping[SeriesKey, float], *, derive: bool = True, dialect: Dialect = VLLM) -> dict[str, float]:
    """Flat values from raw series: one keyed sum per canonical name (+ kept labels), using only
    the most preferred sample name present for each canonical name; gauges in ``MEAN_GAUGES``
    averaged. With ``derive``, adds the ratios listed in the module docstring.

    Keys: canonical names (``"prompt_tokens"``), or with kept labels
    (``'spec_decode_num_accepted_tokens_per_pos{position="0"}'``).
    """
    best: dict[str, int] = {}
    rules = []
    for (name, labels), v in values.items():
        r = dialect.canonical(name, dict(labels))
        if r is None:
            continue
        rules.append((r, labels, v))
        if r.rank < best.get(r.canon, 99):
            best[r.canon] = r.rank
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for r, labels, v in rules:
        if r.rank != best[r.canon]:
            continue
        key = _agg_key(r.canon, labels)
        sums[key] += v
        counts[key] += 1
    out = {k: (v / counts[k] if k in MEAN_GAUGES else v) for k, v in sums.items()}
    for canon, source in dialect.aliases.items():  # (queries = prompt tokens, where not counted)
        if canon not in out and source in out:
            out[canon] = out[source]
    for canon, (num, den) in dialect.ratios.items():
        _ratio(out, canon, out.get(num), out.get(den))
    if derive:
        out.update(_derived(out))
    return out


def _ratio(out: dict[str, float], key: str, num: float | None, den: float | None, plus: float = 0.0) -> None:
    if num is not None and den:
        out[key] = plus + num / den


def _derived(v: Mapping[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    acc, drafts, dtok = (
        v.get("spec_decode_num_accepted_tokens"),
        v.get("spec_decode_num_drafts"),
        v.get("spec_decode_num_draft_tokens"),
    )
    _ratio(out, "spec_decode_acceptance_rate", acc, dtok)
    _ratio(out, "spec_decode_mean_acceptance_length", acc, drafts, plus=1.0)
    prefix = "spec_decode_num_accepted_tokens_per_pos{"
    for k, val in v.items():
        if k.startswith(prefix):
            _ratio(out, "spec_decode_acceptance_rate_per_pos{" + k[len(prefix) :], val, drafts)
    _ratio(out, "prefix_cache_hit_rate", v.get("prefix_cache_hits"), v.get("prefix_cache_queries"))
    _ratio(out, "mm_cache_hit_rate", v.get("mm_cache_hits"), v.get("mm_cache_queries"))
    for what in ("ttft", "itl", "e2e", "queue"):
        _ratio(
            out,
            f"server_mean_{what}_seconds",
            v.get(f"server_{what}_seconds_sum"),
            v.get(f"server_{what}_seconds_count"),
        )
    return out


def parse_metrics(text: str, dialect: Dialect = VLLM) -> dict[str, float]:
    """Aggregated values (and derived ratios) of one ``/metrics`` text in an engine's dialect;
    see ``aggregate``. Raises ``ValueError`` for unparsable text."""
    return aggregate(parse_series(text, dialect)[0], dialect=dialect)


def parse_vllm_metrics(text: str) -> dict[str, float]:
    """``parse_metrics`` in vLLM's dialect."""
    return parse_metrics(text, VLLM)


def series_deltas(
    before: Mapping[SeriesKey, float],
    after: Mapping[SeriesKey, float],
    created_before: Mapping[SeriesKey, float] | None = None,
    created_after: Mapping[SeriesKey, float] | None = None,
    dialect: Dialect = VLLM,
) -> dict[SeriesKey, float]:
    """Per-series counter increase from ``before`` to ``after`` (gauges are skipped).

    A series that decreased, or whose ``_created`` time changed, was reset: its increase is its
    value in ``after`` (B20). A series absent from ``before`` (a new engine) counts its whole value;
    one absent from ``after`` contributes nothing.
    """
    cb = created_before or {}
    ca = created_after or {}
    out: dict[SeriesKey, float] = {}
    for key, v in after.items():
        if dialect.kind(key[0]) != "counter":
            continue
        prev = before.get(key)
        if prev is None or is_reset(prev, v, cb.get(key), ca.get(key)):
            out[key] = v
        else:
            out[key] = v - prev
    return out


def is_reset(prev: float, value: float, created_prev: float | None, created_now: float | None) -> bool:
    return value < prev or (created_prev is not None and created_now is not None and created_prev != created_now)


def check_invariants(agg: Mapping[str, float]) -> list[str]:
    """Problems between related aggregated counters (empty list when consistent): the
    per-position accepted tokens must add up to the accepted total (B19); hits <= queries."""
    problems = []
    prefix = "spec_decode_num_accepted_tokens_per_pos{"
    per_pos = [v for k, v in agg.items() if k.startswith(prefix)]
    total = agg.get("spec_decode_num_accepted_tokens")
    if per_pos and total is not None and abs(sum(per_pos) - total) > 1e-9 * max(1.0, total):
        problems.append(f"per-position accepted tokens sum to {sum(per_pos):g}, total is {total:g}")
    h, q = agg.get("prefix_cache_hits"), agg.get("prefix_cache_queries")
    if h is not None and q is not None and h > q:
        problems.append(f"prefix cache hits {h:g} exceed queries {q:g}")
    return problems
