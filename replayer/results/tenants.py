"""Tenants of a mixed run (``replayer.trace.mix``): per-tenant metrics and summary sections.

The tenant names come from the mix (the config), a closed set fixed before the run, so the
``tenant`` label is bounded. Metrics (only registered when the run has a mix):
``replayer_tenant_requests_total{tenant,outcome}``, ``replayer_tenant_ttft_seconds{tenant}``,
``replayer_tenant_e2e_latency_seconds{tenant}`` (successful requests, as the run-wide histograms)
and ``replayer_tenant_session_wait_seconds{tenant}`` (histograms with explicit log-spaced buckets).

The summary's ``tenants`` section has, per tenant: requests by outcome, token totals, and
count/mean/median/p99 (nearest rank, ``stats.Stat``) of TTFT, TPOT, E2E, dispatch lag and
session wait, and the expected prefix-cache hit tokens, warm-up rows left out. It reads only the
columns it needs.
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry

from replayer.core.errors import SUMMARY_COUNTS
from replayer.core.result import without_warmup
from replayer.core.stats import latency_fields
from replayer.observe.groupmetrics import GroupMetrics
from replayer.results.summarytext import fmt_ms, format_groups

_STATS = ("ttft_ms", "tpot_ms", "e2e_ms", "dispatch_lag_ms", "session_wait_ms")
_COLUMNS = ("tenant", "outcome", "prompt_tokens", "completion_tokens", "expected_prefix_hit_tokens", *_STATS)


class TenantMetrics(GroupMetrics):
    """The per-tenant series (``replayer.observe.groupmetrics``), children created up front for every tenant."""

    def __init__(self, registry: CollectorRegistry, tenants: list[str]) -> None:
        super().__init__(registry, "tenant", tenants, "tenant (trace of the mix)", session_wait=True)


def tenant_sections(table) -> dict:
    """Per-tenant summary sections of a results table (module docstring); {} when no row has a tenant."""
    if "tenant" not in table.column_names:
        return {}
    out: dict[str, dict] = {}
    tenants = [t for t in pc.unique(table.column("tenant")).to_pylist() if t is not None]
    for name in sorted(tenants):
        t = table.filter(pc.equal(table.column("tenant"), name))
        outcome = t.column("outcome").to_pylist()
        sec: dict = {"requests": t.num_rows, **{k: outcome.count(o.value) for o, k in SUMMARY_COUNTS.items()}}
        for col, key in (
            ("prompt_tokens", "total_input_tokens"),
            ("completion_tokens", "total_output_tokens"),
            ("expected_prefix_hit_tokens", "expected_prefix_hit_tokens"),
        ):
            if col in t.column_names:
                v = pc.sum(t.column(col)).as_py()
                sec[key] = int(v) if v is not None else None
        for col in _STATS:
            if col not in t.column_names:
                continue
            sec.update(
                latency_fields(
                    col.removesuffix("_ms"), np.asarray(t.column(col).to_numpy(zero_copy_only=False), dtype=np.float64)
                )
            )
        out[name] = sec
    return out


def read_tenant_sections(*results_dirs: str) -> dict:
    """``tenant_sections`` of results folders together (shards, workers: ``recorder.read_results``,
    the needed columns only)."""
    import pyarrow as pa

    from replayer.record.folder import read_results

    tables = [without_warmup(read_results(d, columns=_columns_of(d))) for d in results_dirs]
    return tenant_sections(pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0])


def _columns_of(results_dir: str) -> list[str]:
    """``_COLUMNS``, and ``warmup`` when the folder's files have it (warm-up rows are left out)."""
    import pyarrow.parquet as pq

    from replayer.record.folder import result_files

    try:
        names = [set(pq.read_schema(f).names) for f in result_files(results_dir)]
    except (OSError, ValueError):
        names = []
    return [*_COLUMNS, "warmup"] if names and all("warmup" in n for n in names) else list(_COLUMNS)


def format_tenants(sections: dict) -> str:
    """One line per tenant for the printed summary."""
    return format_groups(
        "Tenants", sections, lambda s: f" ms, session wait p99 {fmt_ms(s.get('p99_session_wait_ms'))} ms"
    )
