"""Tenants of a mixed run (``replayer.trace.mix``): per-tenant metrics and summary sections.

The tenant names come from the mix (the config), a closed set fixed before the run, so the
``tenant`` label is bounded. Metrics (only registered when the run has a mix):
``replayer_tenant_requests_total{tenant,outcome}``, ``replayer_tenant_ttft_seconds{tenant}``,
``replayer_tenant_e2e_latency_seconds{tenant}`` (successful requests, as the run-wide histograms)
and ``replayer_tenant_session_wait_seconds{tenant}`` (histograms with explicit log-spaced buckets).

The summary's ``tenants`` section has, per tenant: requests by outcome, token totals, and
count/mean/median/p99 (nearest rank, ``stats.Stat``) of TTFT, TPOT, E2E, dispatch lag and
session wait, and the expected prefix-cache hit tokens. It reads only the columns it needs.
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Histogram

from .errors import Outcome
from .metrics import log_buckets
from .result import RequestResult
from .stats import Stat

_LATENCY = log_buckets(0.001, 600.0)
_STATS = ("ttft_ms", "tpot_ms", "e2e_ms", "dispatch_lag_ms", "session_wait_ms")
_COLUMNS = ("tenant", "outcome", "prompt_tokens", "completion_tokens", "expected_prefix_hit_tokens", *_STATS)


class TenantMetrics:
    """The per-tenant series, children created up front for every tenant of the mix."""

    def __init__(self, registry: CollectorRegistry, tenants: list[str]) -> None:
        self.tenants = frozenset(tenants)
        self.requests = Counter("replayer_tenant_requests_total", "Requests that ended, by tenant (trace of the "
                                "mix) and outcome", ["tenant", "outcome"], registry=registry)
        self.ttft = Histogram("replayer_tenant_ttft_seconds", "Time to first token by tenant", ["tenant"],
                              buckets=_LATENCY, registry=registry)
        self.e2e = Histogram("replayer_tenant_e2e_latency_seconds", "End-to-end latency by tenant", ["tenant"],
                             buckets=_LATENCY, registry=registry)
        self.wait = Histogram("replayer_tenant_session_wait_seconds", "Time a session turn was held for its "
                              "predecessor, by tenant", ["tenant"], buckets=_LATENCY, registry=registry)
        for t in tenants:
            for o in Outcome:
                self.requests.labels(t, o.value)
            self.ttft.labels(t)
            self.e2e.labels(t)
            self.wait.labels(t)

    def on_result(self, res: RequestResult) -> None:
        t = res.tenant
        if t not in self.tenants:
            return
        outcome = Outcome(res.outcome)
        self.requests.labels(t, outcome.value).inc()
        if res.session_wait_ms is not None:
            self.wait.labels(t).observe(res.session_wait_ms / 1e3)
        if outcome is not Outcome.SUCCESS:  # latency histograms hold successful requests only
            return
        if res.ttft_ms is not None:
            self.ttft.labels(t).observe(res.ttft_ms / 1e3)
        if res.e2e_ms is not None:
            self.e2e.labels(t).observe(res.e2e_ms / 1e3)


def tenant_sections(table) -> dict:
    """Per-tenant summary sections of a results table (module docstring); {} when no row has a tenant."""
    if "tenant" not in table.column_names:
        return {}
    out: dict[str, dict] = {}
    tenants = [t for t in pc.unique(table.column("tenant")).to_pylist() if t is not None]
    for name in sorted(tenants):
        t = table.filter(pc.equal(table.column("tenant"), name))
        outcome = t.column("outcome").to_pylist()
        sec: dict = {"requests": t.num_rows, **{o.value: outcome.count(o.value) for o in Outcome}}
        for col, key in (("prompt_tokens", "total_input_tokens"), ("completion_tokens", "total_output_tokens"),
                         ("expected_prefix_hit_tokens", "expected_prefix_hit_tokens")):
            if col in t.column_names:
                v = pc.sum(t.column(col)).as_py()
                sec[key] = int(v) if v is not None else None
        for col in _STATS:
            if col not in t.column_names:
                continue
            st = Stat()
            st.add(np.asarray(t.column(col).to_numpy(zero_copy_only=False), dtype=np.float64))
            base = col.removesuffix("_ms")
            sec[f"mean_{base}_ms"] = st.mean if st.count else None
            sec[f"median_{base}_ms"] = st.percentile(50)
            sec[f"p99_{base}_ms"] = st.percentile(99)
        out[name] = sec
    return out


def read_tenant_sections(*results_dirs: str) -> dict:
    """``tenant_sections`` of results folders together (shards, workers: ``recorder.read_results``,
    the needed columns only)."""
    import pyarrow as pa

    from .recorder import read_results

    tables = [read_results(d, columns=list(_COLUMNS)) for d in results_dirs]
    return tenant_sections(pa.concat_tables(tables) if len(tables) > 1 else tables[0])


def format_tenants(sections: dict) -> str:
    """One line per tenant for the printed summary."""
    lines = ["Tenants"]
    for name, s in sections.items():
        def ms(v):
            return "n/a" if v is None else f"{v:,.2f}"
        lines.append(f"  {name}: {s['requests']} requests ({s.get('success', 0)} ok, {s.get('failed', 0)} failed), "
                     f"TTFT p50 {ms(s.get('median_ttft_ms'))} / p99 {ms(s.get('p99_ttft_ms'))} ms, "
                     f"E2E p50 {ms(s.get('median_e2e_ms'))} ms, session wait p99 {ms(s.get('p99_session_wait_ms'))} ms")
    return "\n".join(lines)
