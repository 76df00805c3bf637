"""Generate the Grafana dashboard (deploy/grafana/dashboards/replayer.json) from code.

    python deploy/grafana/dashboard.py            # rewrite the JSON
    python deploy/grafana/dashboard.py --check    # exit 1 if the JSON is out of date

Every query uses fixed windows (``[1m]``), so it works with any scrape interval up to 30 s and
can be run as-is against the Prometheus HTTP API (tests/test_prometheus_e2e.py runs all of them).
Datasource: the provisioned Prometheus with uid ``prometheus``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards" / "replayer.json"
DS = {"type": "prometheus", "uid": "prometheus"}
W = "1m"


def q(expr: str, legend: str) -> dict:
    return {"expr": expr, "legendFormat": legend}


def quantiles(metric: str, qs=(0.5, 0.9, 0.99)) -> list[dict]:
    return [q(f"histogram_quantile({x}, sum by (le) (rate({metric}_bucket[{W}])))", f"p{int(x * 100)}") for x in qs]


def attainment(by: str, match: str, window: str = W) -> str:
    """SLO attainment: met / (met + missed) of replayer_slo_requests_total (unknown left out)."""
    return (
        f'sum by ({by}) (rate(replayer_slo_requests_total{{{match}result="met"}}[{window}]))'
        f' / sum by ({by}) (rate(replayer_slo_requests_total{{{match}result=~"met|missed"}}[{window}]))'
    )


# (title, unit, targets, width); rows of 24 grid units
PANELS: list[tuple[str, str, list[dict], int] | str] = [
    "Verdict (SLOs from --goodput; empty without bounds)",
    ("SLO attainment (met / judged; failed = missed)", "percentunit", [q(attainment("slo", ""), "{{slo}}")], 8),
    (
        "Goodput (requests meeting every bound)",
        "reqps",
        [
            q(f'sum(rate(replayer_slo_requests_total{{slo="all",result="met"}}[{W}]))', "request goodput"),
            q(f'sum(rate(replayer_slo_requests_total{{slo="all",result="missed"}}[{W}]))', "missed"),
            q(f'sum(rate(replayer_slo_requests_total{{slo="all",result="unknown"}}[{W}]))', "unknown"),
        ],
        8,
    ),
    (
        "Latency from the due time (coordinated-omission-free)",
        "s",
        [
            dict(t, legendFormat=f"TTFT {t['legendFormat']}")
            for t in quantiles("replayer_ttft_from_due_seconds", (0.5, 0.99))
        ]
        + [
            dict(t, legendFormat=f"E2E {t['legendFormat']}")
            for t in quantiles("replayer_e2e_latency_from_due_seconds", (0.5, 0.99))
        ],
        8,
    ),
    "Replay",
    (
        "Requests: scheduled vs sent vs completed",
        "reqps",
        [
            q(f"sum(rate(replayer_requests_scheduled_total[{W}]))", "scheduled"),
            q(f"sum(rate(replayer_requests_due_total[{W}]))", "due (schedule clock)"),
            q(f"sum(rate(replayer_requests_sent_total[{W}]))", "sent"),
            q(f'sum(rate(replayer_requests_total{{outcome="success"}}[{W}]))', "completed"),
            q(f'sum(rate(replayer_requests_total{{outcome!="success"}}[{W}]))', "failed / cancelled / not started"),
        ],
        12,
    ),
    (
        "Dispatch lag (sent - due)",
        "s",
        quantiles("replayer_dispatch_lag_seconds", (0.5, 0.99))
        + [q("max(replayer_event_loop_lag_max_seconds)", "event-loop lag max (replayer)")],
        12,
    ),
    ("In flight", "short", [q("sum(replayer_requests_in_flight)", "in flight")], 8),
    (
        "Errors by kind",
        "reqps",
        [q(f'sum by (error_kind) (rate(replayer_requests_total{{outcome="failed"}}[{W}]))', "{{error_kind}}")],
        8,
    ),
    (
        "Usage mismatches vs trace (per 5 min)",
        "short",
        [q("sum by (field) (increase(replayer_usage_mismatches_total[5m]))", "{{field}}")],
        8,
    ),
    "Latency",
    ("TTFT", "s", quantiles("replayer_ttft_seconds"), 12),
    ("E2E latency", "s", quantiles("replayer_e2e_latency_seconds"), 12),
    ("ITL (token-weighted)", "s", quantiles("replayer_itl_seconds"), 12),
    ("TPOT", "s", quantiles("replayer_tpot_seconds"), 12),
    (
        "Client overhead: TTFT - server queue - server TTFT (--server-timings; vs TTFT)",
        "s",
        [
            dict(t, legendFormat=f"overhead {t['legendFormat']}")
            for t in quantiles("replayer_client_overhead_seconds", (0.5, 0.99))
        ]
        + [dict(t, legendFormat=f"TTFT {t['legendFormat']}") for t in quantiles("replayer_ttft_seconds", (0.5,))],
        12,
    ),
    "Tenants (a mix of traces: replayer run A B; empty for one trace)",
    (
        "Requests completed by tenant",
        "reqps",
        [
            q(f'sum by (tenant) (rate(replayer_tenant_requests_total{{outcome="success"}}[{W}]))', "{{tenant}}"),
            q(f'sum by (tenant) (rate(replayer_tenant_requests_total{{outcome="failed"}}[{W}]))', "{{tenant}} failed"),
        ],
        8,
    ),
    (
        "TTFT p99 by tenant",
        "s",
        [
            q(
                f"histogram_quantile(0.99, sum by (le, tenant) (rate(replayer_tenant_ttft_seconds_bucket[{W}])))",
                "{{tenant}}",
            )
        ],
        8,
    ),
    (
        "Session wait p99 by tenant (turn held for its predecessor)",
        "s",
        [
            q(
                f"histogram_quantile(0.99, sum by (le, tenant) (rate(replayer_tenant_session_wait_seconds_bucket[{W}])))",
                "{{tenant}}",
            )
        ],
        8,
    ),
    "Tokens and trace",
    (
        "Token throughput",
        "short",
        [
            q(f"sum(rate(replayer_prompt_tokens_sent_total[{W}]))", "prompt tokens sent/s"),
            q(f"sum(rate(replayer_server_prompt_tokens_total[{W}]))", "prompt tokens (server usage)/s"),
            q(f"sum(rate(replayer_server_completion_tokens_total[{W}]))", "completion tokens (server usage)/s"),
        ],
        12,
    ),
    (
        "Trace progress",
        "percentunit",
        [
            q("sum(replayer_trace_rows_done) / sum(replayer_trace_rows)", "rows done"),
            q("max(replayer_trace_time_seconds) / max(replayer_trace_duration_seconds)", "trace time reached"),
        ],
        6,
    ),
    ("Loop", "short", [q("max(replayer_loop)", "loop")], 6),
    "Target server (vLLM metrics)",
    (
        "Requests running / waiting",
        "short",
        [q("sum(vllm:num_requests_running)", "running"), q("sum(vllm:num_requests_waiting)", "waiting")],
        8,
    ),
    ("KV-cache usage", "percentunit", [q("max(vllm:kv_cache_usage_perc)", "kv cache usage")], 8),
    (
        "Prefix-cache hit rate: server vs expected from trace",
        "percentunit",
        [
            q(
                f"sum(rate(vllm:prefix_cache_hits_total[{W}])) / sum(rate(vllm:prefix_cache_queries_total[{W}]))",
                "server",
            ),
            q(
                f"sum(rate(replayer_expected_prefix_cache_hit_tokens_total[{W}]))"
                f" / sum(rate(replayer_expected_prefix_cache_query_tokens_total[{W}]))",
                "expected (trace)",
            ),
        ],
        8,
    ),
    "Replayer process",
    (
        "Replayer CPU",
        "percentunit",
        [q(f"sum(rate(process_cpu_seconds_total[{W}]) and on (job, instance) replayer_build_info)", "cpu cores")],
        12,
    ),
    ("Replayer event-loop lag", "s", quantiles("replayer_event_loop_lag_seconds", (0.5, 0.99)), 12),
]


def build() -> dict:
    panels, x, y, h, pid = [], 0, 0, 8, 1
    for p in PANELS:
        if isinstance(p, str):
            if x:
                x, y = 0, y + h
            panels.append(
                {
                    "id": pid,
                    "type": "row",
                    "title": p,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                    "panels": [],
                }
            )
            pid, y = pid + 1, y + 1
            continue
        title, unit, targets, w = p
        if x + w > 24:
            x, y = 0, y + h
        panels.append(
            {
                "id": pid,
                "type": "timeseries",
                "title": title,
                "datasource": DS,
                "gridPos": {"h": h, "w": w, "x": x, "y": y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {
                    "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "none"},
                },
                "targets": [dict(t, datasource=DS, refId=chr(ord("A") + i)) for i, t in enumerate(targets)],
            }
        )
        pid, x = pid + 1, x + w
    return {
        "uid": "replayer",
        "title": "replayer: trace replay",
        "tags": ["replayer", "llm"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "annotations": {"list": []},
        "templating": {"list": []},
        "panels": panels,
    }


def expressions(dashboard: dict) -> list[str]:
    """Every PromQL expression of a dashboard JSON."""
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def main(argv: list[str]) -> int:
    text = json.dumps(build(), indent=2) + "\n"
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
