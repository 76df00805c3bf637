"""One engine's ``/metrics`` dialect: its sample names mapped to replayer's canonical names.

A ``Dialect`` lists, per canonical name, the engine's sample names in order of preference (the
first one present wins; never two summed). A sample may be narrowed to a label value with
``name{label="value"}`` (Dynamo counts successes and errors in one counter, told apart by
``status``). A canonical name a dialect does not list is **unknown** for that engine: left out
of the aggregates and said null in the summary, never 0.

``aliases`` name a canonical counter an engine does not export but that equals another one it
does (SGLang and Dynamo count no prefix-cache *queries*: every prompt token is looked up, so the
queries are the prompt tokens; marked estimated in the docs). ``ratios`` give a gauge as the
quotient of two others (Dynamo's KV usage: active blocks / total blocks). Gauges in
``MEAN_GAUGES`` (fractions and rates) are averaged over series, never summed; a rate gauge is
never differenced or summed over time (it lives in ``latest`` only, not in the run's deltas).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "CANONICAL_COUNTERS",
    "CANONICAL_GAUGES",
    "MEAN_GAUGES",
    "KEPT_LABELS",
    "Dialect",
    "SampleRule",
    "SAMPLE_SPEC",
]

#: the canonical counters (histogram ``_sum``/``_count`` samples are counters too)
CANONICAL_COUNTERS = (
    "prompt_tokens",
    "generation_tokens",
    "request_success",
    "num_preemptions",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "mm_cache_queries",
    "mm_cache_hits",
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
    "spec_decode_num_accepted_tokens_per_pos",
    "server_ttft_seconds_sum",
    "server_ttft_seconds_count",
    "server_itl_seconds_sum",
    "server_itl_seconds_count",
    "server_e2e_seconds_sum",
    "server_e2e_seconds_count",
    "server_queue_seconds_sum",
    "server_queue_seconds_count",
)
#: the canonical gauges: ``server_*`` ones are the engine's own rates (never summed over time)
CANONICAL_GAUGES = (
    "num_requests_running",
    "num_requests_waiting",
    "kv_cache_usage_perc",
    "server_prefix_cache_hit_rate",
    "server_spec_decode_acceptance_length",
    "server_spec_decode_acceptance_rate",
    # the server process's memory (prometheus_client's process collector; issue 45: a drift signal)
    "process_resident_memory_bytes",
)
#: gauges aggregated by the mean over series (fractions, rates), not the sum
MEAN_GAUGES = frozenset(
    {
        "kv_cache_usage_perc",
        "server_prefix_cache_hit_rate",
        "server_spec_decode_acceptance_length",
        "server_spec_decode_acceptance_rate",
    }
)
#: labels kept in the aggregate key (all others are summed over)
KEPT_LABELS: dict[str, tuple[str, ...]] = {"spec_decode_num_accepted_tokens_per_pos": ("position",)}

SAMPLE_SPEC = re.compile(r'^([^{]+)(?:\{([^=]+)="([^"]*)"\})?$')


@dataclass(frozen=True, slots=True)
class SampleRule:
    """A sample name read as ``canon`` (a counter or gauge), ``rank`` its preference (0 best),
    ``label``: ``(name, value)`` the sample must carry, or None."""

    canon: str
    kind: str
    rank: int
    label: tuple[str, str] | None


@dataclass(frozen=True)
class Dialect:
    """One engine's ``/metrics`` names (see the module docstring). ``source``: where the names
    come from (repository file at a commit), for the docs and the reader's trust."""

    name: str
    source: str
    counters: Mapping[str, tuple[str, ...]]
    gauges: Mapping[str, tuple[str, ...]]
    aliases: Mapping[str, str] = field(default_factory=dict)
    ratios: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    #: private gauges (the parts of a ratio): read, kept in the samples, not canonical
    parts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: (derived) sample name -> the rules that read it; ``X_created`` -> its ``X_total``
    rules: Mapping[str, list[SampleRule]] = field(init=False, repr=False, compare=False)
    created: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rules: dict[str, list[SampleRule]] = {}
        for kind, table in (("counter", self.counters), ("gauge", self.gauges), ("gauge", self.parts)):
            for canon, specs in table.items():
                if kind == "counter" and canon not in CANONICAL_COUNTERS and table is self.counters:
                    raise ValueError(f"{self.name}: {canon} is not a canonical counter")
                if table is self.gauges and canon not in CANONICAL_GAUGES:
                    raise ValueError(f"{self.name}: {canon} is not a canonical gauge")
                for rank, spec in enumerate(specs):
                    m = SAMPLE_SPEC.match(spec)
                    if m is None:
                        raise ValueError(f"{self.name}: bad sample spec {spec!r}")
                    label = (m.group(2), m.group(3)) if m.group(2) else None
                    rules.setdefault(m.group(1), []).append(SampleRule(canon, kind, rank, label))
        object.__setattr__(self, "rules", rules)
        object.__setattr__(
            self, "created", {n[: -len("_total")] + "_created": n for n in rules if n.endswith("_total")}
        )

    def kind(self, sample: str) -> str:
        """``"counter"`` or ``"gauge"`` for a sample name this dialect reads."""
        return self.rules[sample][0].kind

    def known(self) -> list[str]:
        """The canonical names this engine reports (directly, by an alias or a ratio)."""
        return sorted(set(self.counters) | set(self.gauges) | set(self.aliases) | set(self.ratios))

    def unknown(self) -> list[str]:
        """The canonical names this engine never reports (null in the summary, never 0)."""
        return sorted((set(CANONICAL_COUNTERS) | set(CANONICAL_GAUGES)) - set(self.known()))

    def canonical(self, sample: str, labels: Mapping[str, str]) -> SampleRule | None:
        """The rule that reads this sample (with these labels), or None."""
        for r in self.rules.get(sample, ()):
            if r.label is None or labels.get(r.label[0]) == r.label[1]:
                return r
        return None
