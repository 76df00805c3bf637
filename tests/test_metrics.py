"""Metrics: names and docs agree, quantiles match PromQL's, the new helpers behave."""

import asyncio
import re
import shutil
import subprocess

import numpy as np
import pytest
from conftest import ROOT
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from replayer.core import PreparedRequest, RequestResult
from replayer.observe import ReplayerMetrics
from replayer.observe.looplag import EventLoopLagMonitor
from replayer.observe.metrics import metric_names, quantile_from_buckets
from replayer.observe.runlabels import RunInfo


def _metrics(clock=None):
    r = CollectorRegistry()
    kw = {"clock": clock} if clock else {}
    return r, ReplayerMetrics(r, config_info={"speedup": "10"}, **kw)


def _values(r: CollectorRegistry) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(r).decode()):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            out[key] = s.value
    return out


def test_every_metric_is_documented_and_follows_conventions():
    from replayer.results.targets import TargetMetrics
    from replayer.results.tenants import TenantMetrics
    from replayer.results.verdictwatch import VerdictWatch

    r, m = _metrics()
    TenantMetrics(r, ["a"])  # (registered by a mixed run)
    TargetMetrics(r, ["http://a:1", "http://b:2"])  # (registered by a run with several targets)
    RunInfo(r, model="m", targets=["http://a:1"], shard="0/1", trace="t")  # (registered once the model is known)
    VerdictWatch(r, window_s=300)  # (the live verdicts: families listed before judged, without samples)
    m.results_disk.source = lambda: (12345, 1.7e9)  # (exported once the recorder knows them)
    names = metric_names(r)
    doc = (ROOT / "docs" / "metrics.md").read_text()
    for name in names:
        assert f"`{name}`" in doc or name in doc, f"{name} missing from docs/metrics.md"
        assert name.startswith(("replayer_", "process_")), name
    documented = set(re.findall(r"`(replayer_[a-z_]+)`", doc))
    assert documented <= set(names), documented - set(names)
    for fam in r.collect():
        assert fam.type != "summary", fam.name


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing (apt-get install prometheus)")
def test_promtool_accepts_the_exposition_with_data():
    r, m = _metrics()
    _feed(m)
    out = subprocess.run(["promtool", "check", "metrics"], input=generate_latest(r), capture_output=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _feed(m: ReplayerMetrics) -> None:
    m.set_trace(rows=3, duration_s=30.0, speedup=10.0)
    m.on_scheduled(3)
    for i in range(3):
        m.on_sent(
            PreparedRequest(
                index=i,
                row=i,
                due_ns=i * 1_000_000_000,
                body=b"",
                input_length=100,
                output_length=10,
                prompt_len=100,
                max_tokens=10,
                trace_ns=i * 10**10,
            )
        )
    ok = RequestResult(
        row=0,
        input_length=100,
        output_length=10,
        sent_ns=1,
        outcome="success",
        prompt_tokens=101,
        completion_tokens=10,
        ttft_ms=50.0,
        e2e_ms=140.0,
        tpot_ms=10.0,
        dispatch_lag_ms=-0.2,
        itl_ms=[10.0] * 9,
    )
    bad = RequestResult(
        row=1,
        input_length=100,
        output_length=10,
        sent_ns=2,
        outcome="failed",
        error_kind="timeout",
        dispatch_lag_ms=3.0,
    )
    m.on_dispatched(ok)  # lag observed when each went out
    m.on_dispatched(bad)
    m.on_result(ok)
    m.on_result(bad)


def test_counters_and_progress():
    r, m = _metrics()
    _feed(m)
    v = _values(r)
    assert v["replayer_requests_sent_total"] == 3
    assert v["replayer_requests_in_flight"] == 1
    assert v["replayer_requests_total{error_kind=timeout,outcome=failed}"] == 1
    assert v["replayer_requests_total{error_kind=none,outcome=success}"] == 1
    assert v["replayer_usage_mismatches_total{field=prompt_tokens}"] == 1
    assert v["replayer_usage_mismatches_total{field=completion_tokens}"] == 0
    assert v["replayer_itl_seconds_count"] == 9
    assert v["replayer_dispatch_lag_seconds_count"] == 2
    assert v["replayer_trace_rows"] == 3 and v["replayer_trace_rows_done"] == 2
    assert v["replayer_trace_time_seconds"] == pytest.approx(20.0)  # due 2 s * speedup 10
    assert v["replayer_trace_duration_seconds"] == 30
    # the first request of loop 1 moves the loop on by itself
    m.on_sent(
        PreparedRequest(
            index=3,
            row=0,
            due_ns=4 * 10**9,
            body=b"",
            input_length=1,
            output_length=1,
            prompt_len=1,
            max_tokens=1,
            loop=1,
            trace_ns=40 * 10**9,
        )
    )
    v = _values(r)
    assert v["replayer_loop"] == 1 and v["replayer_trace_rows_done"] == 0 and v["replayer_trace_time_seconds"] == 0
    m.on_sent(
        PreparedRequest(
            index=4,
            row=1,
            due_ns=5 * 10**9,
            body=b"",
            input_length=1,
            output_length=1,
            prompt_len=1,
            max_tokens=1,
            loop=1,
            trace_ns=50 * 10**9,
        )
    )
    assert _values(r)["replayer_trace_time_seconds"] == pytest.approx(10.0)
    snap = m.snapshot()
    assert snap["ttft_p50_s"] == pytest.approx(0.05, rel=0.3)
    assert snap["completion_tokens_total"] == 10 and snap["loop"] == 1


def test_due_counter_follows_the_clock():
    now = [0]
    r, m = _metrics(clock=lambda: now[0])
    m.track_due(np.array([0, 10, 10, 30]) * 1_000_000, t0_ns=5_000_000)
    assert _values(r)["replayer_requests_due_total"] == 0
    now[0] = 5_000_000
    assert _values(r)["replayer_requests_due_total"] == 1
    now[0] = 15_000_000
    assert _values(r)["replayer_requests_due_total"] == 3
    now[0] = 10**12
    assert m.due.value() == 4
    m.track_due(count_due=lambda: 17)
    assert _values(r)["replayer_requests_due_total"] == 17


def test_quantile_matches_promql_interpolation():
    bounds = [0.1, 0.2, 0.4]
    assert quantile_from_buckets(0.5, bounds, [0, 0, 0, 0]) is None
    # 10 in (0, 0.1], 10 in (0.1, 0.2]: median at the top of the first bucket, p75 halfway in the second
    assert quantile_from_buckets(0.5, bounds, [10, 20, 20, 20]) == pytest.approx(0.1)
    assert quantile_from_buckets(0.75, bounds, [10, 20, 20, 20]) == pytest.approx(0.15)
    assert quantile_from_buckets(0.99, bounds, [0, 0, 0, 5]) == 0.4  # +Inf bucket -> highest bound
    assert quantile_from_buckets(0.5, [-1.0, 0.0, 1.0], [0, 10, 10, 10]) == pytest.approx(-0.5)


def test_expected_prefix_cache_counters():
    r, m = _metrics()
    m.on_expected_prefix_cache(1000, 512)
    v = _values(r)
    assert v["replayer_expected_prefix_cache_query_tokens_total"] == 1000
    assert v["replayer_expected_prefix_cache_hit_tokens_total"] == 512


def test_each_request_built_is_counted_from_the_request_itself():
    # on_prepared: what prepare used to push (scheduled, and the expected prefix-cache tokens when
    # the request has expected hits), read from the PreparedRequest the run hands on
    r, m = _metrics()

    def req(n_in: int, hits: int | None) -> PreparedRequest:
        p = PreparedRequest(
            index=0, row=0, due_ns=0, body=b"", input_length=n_in, output_length=1, prompt_len=n_in, max_tokens=1
        )
        p.expected_hits = hits
        return p

    for p in (req(1000, 512), req(700, 0), req(300, None)):
        m.on_prepared(p)
    v = _values(r)
    assert v["replayer_requests_scheduled_total"] == 3
    assert v["replayer_expected_prefix_cache_query_tokens_total"] == 1700  # not the one without hits
    assert v["replayer_expected_prefix_cache_hit_tokens_total"] == 512


def test_event_loop_lag_monitor_sees_a_blocked_loop():
    import time

    r, m = _metrics()
    mon = EventLoopLagMonitor(m, interval_s=0.01, window_s=5)

    async def main():
        task = asyncio.create_task(mon.run())
        await asyncio.sleep(0.05)
        time.sleep(0.12)  # block the loop
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    t0 = time.perf_counter()
    asyncio.run(main())
    took_s = time.perf_counter() - t0
    v = _values(r)
    assert mon.samples >= 3
    # it saw the 0.12 s block, in seconds: never more than the whole run took (however long a
    # busy machine made that)
    assert 0.1 <= mon.max_lag_s < took_s, (mon.max_lag_s, took_s)
    assert v["replayer_event_loop_lag_max_seconds"] == pytest.approx(mon.max_lag_s)
    assert v["replayer_event_loop_lag_seconds_count"] == mon.samples
    assert "process_cpu_seconds_total" in v


def test_batched_updates_read_exactly_at_every_collect():
    # the per-request hooks batch their updates in plain numbers: a collect of the registry (a
    # scrape) sees exactly what per-call observe/inc would have made, with no flush by the caller
    from prometheus_client import Histogram

    from replayer.observe.metrics import LAG_BUCKETS, LATENCY_BUCKETS

    r, m = _metrics()
    ref = CollectorRegistry()
    ttft = Histogram("ref_ttft", "x", buckets=LATENCY_BUCKETS, registry=ref)
    lag = Histogram("ref_lag", "x", buckets=LAG_BUCKETS, registry=ref)
    rng = np.random.default_rng(3)
    for i in range(300):
        req = PreparedRequest(
            index=i,
            row=i,
            due_ns=i * 1000,
            body=b"",
            input_length=16,
            output_length=1,
            prompt_len=16,
            max_tokens=1,
            trace_ns=i * 1000,
        )
        m.on_sent(req)
        res = req.new_result(0)
        res.outcome, res.prompt_tokens, res.completion_tokens = "success", 16, 1
        res.ttft_ms = float(rng.lognormal(0, 2))
        res.dispatch_lag_ms = float(rng.normal(0, 0.5))
        m.on_dispatched(res)
        ttft.observe(res.ttft_ms / 1e3)
        lag.observe(res.dispatch_lag_ms / 1e3)
        if i % 100 == 50:  # a scrape in the middle, then more updates
            assert _values(r)["replayer_requests_in_flight"] == 1
        m.on_result(res)
    v, w = _values(r), _values(ref)
    assert v["replayer_requests_sent_total"] == 300 == v["replayer_requests_total{error_kind=none,outcome=success}"]
    assert v["replayer_prompt_tokens_sent_total"] == 4800 and v["replayer_requests_in_flight"] == 0
    for mine, theirs in (("replayer_ttft_seconds", "ref_ttft"), ("replayer_dispatch_lag_seconds", "ref_lag")):
        got = {k.replace(mine, ""): x for k, x in v.items() if k.startswith(mine + "_")}
        want = {k.replace(theirs, ""): x for k, x in w.items() if k.startswith(theirs + "_") and "created" not in k}
        assert {k: x for k, x in got.items() if "created" not in k} == want  # sums bit-identical too
    assert r.get_sample_value("replayer_trace_time_seconds") == pytest.approx(299e-6)


def test_batched_updates_reach_the_objects_within_the_flush_interval():
    r, m = _metrics()
    m.on_result(RequestResult(row=0, outcome="failed", error_kind="connect", sent_ns=1))
    assert m.requests.labels("failed", "connect")._value.get() == 0  # batched
    m._next_flush_s = 0.0  # FLUSH_S has passed
    m.on_result(RequestResult(row=0, outcome="failed", error_kind="connect", sent_ns=1))
    assert m.requests.labels("failed", "connect")._value.get() == 2  # read directly, no collect


def test_results_folder_size_and_oldest_result_are_left_out_until_known():
    r, m = _metrics()
    assert "replayer_results_bytes" not in metric_names(r)
    assert "replayer_results_oldest_timestamp_seconds" not in metric_names(r)
    m.results_disk.source = lambda: (2_000_000, 1_796_000_000.5)
    v = _values(r)
    assert v["replayer_results_bytes"] == 2_000_000
    assert v["replayer_results_oldest_timestamp_seconds"] == 1_796_000_000.5


def test_live_percentiles_never_exceed_the_observed_max():
    # lags of 9.5 to 11.1 ms all fall in one wide bucket (10 .. 21.5 ms): the bucket's linear
    # interpolation put p99 near the bucket's top (15.8 ms with a max of 11.1 ms, as a user saw);
    # the estimate is now clamped to the exact [min, max] observed, and says it is an estimate
    from replayer.core import RequestResult

    _, m = _metrics()
    lags = [9.5 + 0.016 * i for i in range(101)]  # 9.5 .. 11.1 ms
    for i, lag in enumerate(lags):
        m.on_dispatched(RequestResult(row=i, dispatch_lag_ms=lag))
        m.on_result(RequestResult(row=i, outcome="success", ttft_ms=lag, e2e_ms=lag, itl_ms=[lag, lag / 2]))
    snap = m.snapshot()
    for name in ("dispatch_lag", "ttft", "e2e"):
        assert min(lags) / 1e3 <= snap[f"{name}_p50_s"] <= snap[f"{name}_p99_s"] <= max(lags) / 1e3, name
    assert snap["itl_p99_s"] <= max(lags) / 1e3 and snap["itl_p50_s"] >= min(lags) / 2e3
    assert snap["dispatch_lag_p99_s"] == pytest.approx(max(lags) / 1e3)  # clamped, not 15-20 ms
    assert "estimate" in snap["percentile_method"] and "clamped" in snap["percentile_method"]


def test_quantile_from_buckets_is_clamped_to_the_values_seen():
    bounds = [0.1, 0.2, 0.4]
    assert quantile_from_buckets(0.99, bounds, [0, 10, 10, 10]) == pytest.approx(0.199)
    assert quantile_from_buckets(0.99, bounds, [0, 10, 10, 10], lo=0.11, hi=0.12) == 0.12
    assert quantile_from_buckets(0.01, bounds, [0, 10, 10, 10], lo=0.11, hi=0.12) == 0.11
    assert quantile_from_buckets(0.5, bounds, [0, 0, 0, 0], lo=0.1, hi=0.2) is None
