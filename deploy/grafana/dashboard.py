"""Generate the Grafana dashboard (deploy/grafana/dashboards/replayer.json) from code, with
grafana-foundation-sdk (pinned in pyproject's ``test`` extra to the release for Grafana 11.6).

    python deploy/grafana/dashboard.py            # rewrite the JSON
    python deploy/grafana/dashboard.py --check    # exit 1 if the JSON is out of date

Variables (each a multi-select with All, read from ``replayer_run_info``, chained in this order,
so that choosing one narrows the next): ``job`` and ``instance`` (the replayers' scrape),
``model``, ``run_id`` (the run id every replayer series carries), ``target`` (the targets of the
runs chosen, as ``host:port``: the vLLM panels read ``{instance=~"$target"}``, the default
instance of the target's own scrape) and ``tenant`` (a mixed run's traces). Every replayer query is
filtered by job, instance and run id and split by run id; the target's by target and model.
Annotations: the run's events (``replayer_run_event_timestamp_seconds``, drawn at the time each
happened). Every query uses fixed windows (``[1m]``), so it works with any scrape interval up to
30 s and can be run against the Prometheus HTTP API once the variables are substituted
(``substitute``; tests/test_prometheus_e2e.py runs them all). Datasource: the provisioned
Prometheus with uid ``prometheus``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common, dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement, SortOrder, TooltipDisplayMode
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef, VariableRefresh, VariableSort

OUT = Path(__file__).resolve().parent / "dashboards" / "replayer.json"
DS = DataSourceRef(type_val="prometheus", uid="prometheus")
W = "1m"
#: the selectors every query starts from: a replayer series of the runs chosen, a target's series
R = 'job=~"$job",instance=~"$instance",run_id=~"$run_id"'
T = 'instance=~"$target",model_name=~"$model"'
#: the variables, in their chained order: (name, label, query); each one's description is VARIABLE_HELP's
VARIABLES = (
    ("job", "Prometheus job", "label_values(replayer_run_info, job)"),
    ("instance", "instance (replayer)", 'label_values(replayer_run_info{job=~"$job"}, instance)'),
    ("model", "model", 'label_values(replayer_run_info{job=~"$job",instance=~"$instance"}, model)'),
    (
        "run_id",
        "run id",
        'label_values(replayer_run_info{job=~"$job",instance=~"$instance",model=~"$model"}, run_id)',
    ),
    ("target", "target (host:port)", f"label_values(replayer_run_info{{{R}}}, target)"),
    ("tenant", "tenant", f"label_values(replayer_tenant_requests_total{{{R}}}, tenant)"),
)
#: what each variable does (the docs' table)
VARIABLE_HELP = {
    "job": "the Prometheus scrape job(s) of the replayers",
    "instance": "the replayer processes (admin `host:port`; one per `--workers` worker or fleet shard)",
    "model": "the served model the runs replay against (narrows the run ids)",
    "run_id": "the runs (`--run-id`, or the id each run picked); every replayer panel is split by it",
    "target": 'the targets of the runs chosen (`host:port`); the target panels read `{instance=~"$target"}`',
    "tenant": "a mixed run's traces (`replayer run A B`); the Tenants row",
}


def q(expr: str, legend: str) -> dict:
    return {"expr": expr, "legendFormat": legend}


def quantiles(metric: str, qs=(0.5, 0.9, 0.99), by: str = "run_id") -> list[dict]:
    return [
        q(
            f"histogram_quantile({x}, sum by ({by}, le) (rate({metric}_bucket{{{R}}}[{W}])))",
            f"p{int(x * 100)} {{{{{by}}}}}",
        )
        for x in qs
    ]


def rate(metric: str, match: str = "", by: str = "run_id") -> str:
    return f"sum by ({by}) (rate({metric}{{{R}{match}}}[{W}]))"


def attainment(by: str, match: str, window: str = W) -> str:
    """SLO attainment: met / (met + missed) of replayer_slo_requests_total (unknown left out)."""
    return (
        f'sum by (run_id, {by}) (rate(replayer_slo_requests_total{{{R}{match},result="met"}}[{window}]))'
        f' / sum by (run_id, {by}) (rate(replayer_slo_requests_total{{{R}{match},result=~"met|missed"}}[{window}]))'
    )


def named(prefix: str, targets: list[dict]) -> list[dict]:
    return [dict(t, legendFormat=f"{prefix} {t['legendFormat']}") for t in targets]


# (title, unit, targets, width); a str starts a row; rows of 24 grid units
PANELS: list[tuple[str, str, list[dict], int] | str] = [
    "Verdict (SLOs from --goodput; empty without bounds)",
    (
        "SLO attainment (met / judged; failed = missed)",
        "percentunit",
        [q(attainment("slo", ""), "{{slo}} {{run_id}}")],
        8,
    ),
    (
        "Goodput (requests meeting every bound)",
        "reqps",
        [
            q(rate("replayer_slo_requests_total", ',slo="all",result="met"'), "goodput {{run_id}}"),
            q(rate("replayer_slo_requests_total", ',slo="all",result="missed"'), "missed {{run_id}}"),
            q(rate("replayer_slo_requests_total", ',slo="all",result="unknown"'), "unknown {{run_id}}"),
        ],
        8,
    ),
    (
        "Latency from the due time (coordinated-omission-free)",
        "s",
        named("TTFT", quantiles("replayer_ttft_from_due_seconds", (0.5, 0.99)))
        + named("E2E", quantiles("replayer_e2e_latency_from_due_seconds", (0.5, 0.99))),
        8,
    ),
    "Fidelity and drift (the run's verdicts)",
    (
        "Faithful replay (1 = the schedule was kept)",
        "short",
        [q(f"replayer_fidelity_faithful{{{R}}}", "{{run_id}}")],
        8,
    ),
    (
        "Drift: slope of each latency (% per hour)",
        "percent",
        [q(f"replayer_drift_slope_percent_per_hour{{{R}}}", "{{metric}} {{run_id}}")],
        8,
    ),
    ("Drifting (1 = the latency drifts)", "short", [q(f"replayer_drift_drifting{{{R}}}", "{{metric}} {{run_id}}")], 8),
    (
        "Drift windows: p99 of the last closed window",
        "s",
        [q(f'replayer_drift_window_latency_seconds{{{R},percentile="p99"}}', "{{metric}} {{run_id}}")],
        24,
    ),
    "Replay",
    (
        "Requests: scheduled vs sent vs completed",
        "reqps",
        [
            q(rate("replayer_requests_scheduled_total"), "scheduled {{run_id}}"),
            q(rate("replayer_requests_due_total"), "due (schedule clock) {{run_id}}"),
            q(rate("replayer_requests_sent_total"), "sent {{run_id}}"),
            q(rate("replayer_requests_total", ',outcome="success"'), "completed {{run_id}}"),
            q(rate("replayer_requests_total", ',outcome!="success"'), "failed / cancelled / not started {{run_id}}"),
        ],
        12,
    ),
    (
        "Dispatch lag (sent - due)",
        "s",
        quantiles("replayer_dispatch_lag_seconds", (0.5, 0.99))
        + [q(f"max by (run_id) (replayer_event_loop_lag_max_seconds{{{R}}})", "event-loop lag max {{run_id}}")],
        12,
    ),
    ("In flight", "short", [q(f"sum by (run_id) (replayer_requests_in_flight{{{R}}})", "in flight {{run_id}}")], 8),
    (
        "Errors by kind",
        "reqps",
        [q(rate("replayer_requests_total", ',outcome="failed"', "run_id, error_kind"), "{{error_kind}} {{run_id}}")],
        8,
    ),
    (
        "Usage mismatches vs trace (per 5 min)",
        "short",
        [q(f"sum by (run_id, field) (increase(replayer_usage_mismatches_total{{{R}}}[5m]))", "{{field}} {{run_id}}")],
        8,
    ),
    "Latency",
    ("TTFT", "s", quantiles("replayer_ttft_seconds"), 12),
    ("E2E latency", "s", quantiles("replayer_e2e_latency_seconds"), 12),
    ("ITL (token-weighted)", "s", quantiles("replayer_itl_seconds"), 12),
    ("TPOT", "s", quantiles("replayer_tpot_seconds"), 12),
    (
        "Exact p99 of the last minute (per replayer process; the summary's method)",
        "s",
        [q(f'replayer_live_latency_seconds{{{R},percentile="p99"}}', "{{metric}} {{run_id}} {{instance}}")],
        12,
    ),
    (
        "Client overhead: TTFT - server queue - server TTFT (--server-timings; vs TTFT)",
        "s",
        named("overhead", quantiles("replayer_client_overhead_seconds", (0.5, 0.99)))
        + named("TTFT", quantiles("replayer_ttft_seconds", (0.5,))),
        12,
    ),
    "Tenants (a mix of traces: replayer run A B; empty for one trace)",
    (
        "Requests completed by tenant",
        "reqps",
        [
            q(
                rate("replayer_tenant_requests_total", ',tenant=~"$tenant",outcome="success"', "run_id, tenant"),
                "{{tenant}} {{run_id}}",
            ),
            q(
                rate("replayer_tenant_requests_total", ',tenant=~"$tenant",outcome="failed"', "run_id, tenant"),
                "{{tenant}} failed {{run_id}}",
            ),
        ],
        8,
    ),
    (
        "TTFT p99 by tenant",
        "s",
        [
            q(
                "histogram_quantile(0.99, sum by (run_id, le, tenant) "
                f'(rate(replayer_tenant_ttft_seconds_bucket{{{R},tenant=~"$tenant"}}[{W}])))',
                "{{tenant}} {{run_id}}",
            )
        ],
        8,
    ),
    (
        "Session wait p99 by tenant (turn held for its predecessor)",
        "s",
        [
            q(
                "histogram_quantile(0.99, sum by (run_id, le, tenant) "
                f'(rate(replayer_tenant_session_wait_seconds_bucket{{{R},tenant=~"$tenant"}}[{W}])))',
                "{{tenant}} {{run_id}}",
            )
        ],
        8,
    ),
    "Tokens and trace",
    (
        "Token throughput",
        "short",
        [
            q(rate("replayer_prompt_tokens_sent_total"), "prompt tokens sent/s {{run_id}}"),
            q(rate("replayer_server_prompt_tokens_total"), "prompt tokens (server usage)/s {{run_id}}"),
            q(rate("replayer_server_completion_tokens_total"), "completion tokens (server usage)/s {{run_id}}"),
        ],
        12,
    ),
    (
        "Trace progress",
        "percentunit",
        [
            q(
                f"sum by (run_id) (replayer_trace_rows_done{{{R}}}) / sum by (run_id) (replayer_trace_rows{{{R}}})",
                "rows done {{run_id}}",
            ),
            q(
                f"max by (run_id) (replayer_trace_time_seconds{{{R}}})"
                f" / max by (run_id) (replayer_trace_duration_seconds{{{R}}})",
                "trace time reached {{run_id}}",
            ),
        ],
        6,
    ),
    ("Loop", "short", [q(f"max by (run_id) (replayer_loop{{{R}}})", "loop {{run_id}}")], 6),
    "Target server (vLLM metrics of the runs' targets)",
    (
        "Requests running / waiting",
        "short",
        [
            q(f"sum by (instance) (vllm:num_requests_running{{{T}}})", "running {{instance}}"),
            q(f"sum by (instance) (vllm:num_requests_waiting{{{T}}})", "waiting {{instance}}"),
        ],
        8,
    ),
    (
        "KV-cache usage",
        "percentunit",
        [q(f"max by (instance) (vllm:kv_cache_usage_perc{{{T}}})", "kv cache usage {{instance}}")],
        8,
    ),
    (
        "Prefix-cache hit rate: server vs expected from trace",
        "percentunit",
        [
            q(
                f"sum by (instance) (rate(vllm:prefix_cache_hits_total{{{T}}}[{W}]))"
                f" / sum by (instance) (rate(vllm:prefix_cache_queries_total{{{T}}}[{W}]))",
                "server {{instance}}",
            ),
            q(
                f"sum by (run_id) (rate(replayer_expected_prefix_cache_hit_tokens_total{{{R}}}[{W}]))"
                f" / sum by (run_id) (rate(replayer_expected_prefix_cache_query_tokens_total{{{R}}}[{W}]))",
                "expected (trace) {{run_id}}",
            ),
        ],
        8,
    ),
    "Replayer process",
    (
        "Replayer CPU",
        "percentunit",
        [q(rate("process_cpu_seconds_total", "", "run_id, instance"), "cpu cores {{run_id}} {{instance}}")],
        12,
    ),
    ("Replayer event-loop lag", "s", quantiles("replayer_event_loop_lag_seconds", (0.5, 0.99)), 12),
    (
        "Run events (count so far)",
        "short",
        [q(f"sum by (run_id, event) (replayer_run_events_total{{{R}}})", "{{event}} {{run_id}}")],
        24,
    ),
]

#: the run's events as annotations: each drawn at the time it happened (the value is the time)
ANNOTATION_EXPR = f"max by (run_id, instance, event) (replayer_run_event_timestamp_seconds{{{R}}}) * 1000"
#: the panels that read the verdicts' gauges (issue 45): empty until a run has judged
VERDICT_METRICS = (
    "replayer_fidelity_faithful",
    "replayer_drift_slope_percent_per_hour",
    "replayer_drift_drifting",
    "replayer_drift_window_latency_seconds",
)


def _variable(name: str, label: str, query: str) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .description(VARIABLE_HELP[name])
        .datasource(DS)
        .query({"query": query, "refId": f"var-{name}"})
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
    )


def _panel(title: str, unit: str, targets: list[dict], w: int) -> timeseries.Panel:
    p = (
        timeseries.Panel()
        .title(title)
        .datasource(DS)
        .unit(unit)
        .span(w)
        .height(8)
        .legend(
            common.VizLegendOptions()
            .display_mode(LegendDisplayMode.LIST)
            .placement(LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(common.VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.NONE))
    )
    for i, t in enumerate(targets):
        p = p.with_target(
            prometheus.Dataquery()
            .expr(t["expr"])
            .legend_format(t["legendFormat"])
            .ref_id(chr(ord("A") + i))
            .datasource(DS)
        )
    return p


def build() -> dict:
    d = (
        dashboard.Dashboard("replayer: trace replay")
        .uid("replayer")
        .tags(["replayer", "llm"])
        .timezone("browser")
        .editable()
        .refresh("10s")
        .time("now-30m", "now")
        .tooltip(DashboardCursorSync.CROSSHAIR)
    )
    for name, label, query in VARIABLES:
        d = d.with_variable(_variable(name, label, query))
    d = d.annotation(
        dashboard.AnnotationQuery()
        .name("Run events")
        .datasource(DS)
        .enable(True)
        .icon_color("purple")
        .expr(ANNOTATION_EXPR)
    )
    for p in PANELS:
        d = d.with_row(dashboard.Row(p)) if isinstance(p, str) else d.with_panel(_panel(*p))
    model = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    for i, panel in enumerate(model["panels"], 1):  # (rows included: Grafana wants every id unique)
        panel["id"] = i
    # the Prometheus annotation's own options (the SDK's AnnotationQuery has no fields for them):
    # each event at the time its value says, titled by its kind
    for a in model["annotations"]["list"]:
        if a.get("name") == "Run events":
            a.update(
                {
                    "step": "15s",
                    "titleFormat": "{{event}}",
                    "textFormat": "run {{run_id}} on {{instance}}",
                    "tagKeys": "event,run_id",
                    "useValueForTime": True,
                }
            )
    return model


def expressions(model: dict) -> list[str]:
    """Every PromQL expression of a dashboard JSON's panels."""
    return [t["expr"] for p in model["panels"] for t in p.get("targets", [])]


def annotation_expressions(model: dict) -> list[str]:
    return [a["expr"] for a in model["annotations"]["list"] if a.get("expr")]


def substitute(expr: str, values: dict[str, str]) -> str:
    """``expr`` with each ``$variable`` replaced by ``values[variable]`` (a regex: one value, or
    ``.*`` for All), as Grafana does before it sends the query."""
    return re.sub(r"\$(\w+)", lambda m: values.get(m.group(1), m.group(0)), expr)


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
