"""The run's own series (issue 46): the run id on every series, replayer_run_info, the events, the
live window, the fine buckets and the last scrape (linger, push)."""

import asyncio
import shutil
import subprocess
import time
import urllib.request

import numpy as np
import pytest
from conftest import free_port, wait_http
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from replayer.core import RequestResult, Stat
from replayer.observe import AdminServer, ReplayerMetrics
from replayer.observe.events import EVENTS, RunEvents
from replayer.observe.histograms import LATENCY_BUCKETS, TOKEN_LATENCY_BUCKETS, BatchedHistogram
from replayer.observe.lastscrape import DEFAULT_LINGER_S, linger, linger_for, push_once
from replayer.observe.livewindow import LiveWindow
from replayer.observe.metricparts import quantile_from_buckets
from replayer.observe.runlabels import RunInfo, RunLabels, target_address


def _samples(exposition) -> list:
    text = generate_latest(exposition).decode()
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def test_every_series_carries_the_run_id_and_run_info_names_each_target():
    r = CollectorRegistry()
    ReplayerMetrics(r)
    RunInfo(r, model="m", targets=["http://10.0.0.1:8000/", "https://llm.example"], shard="1/4", trace="t.jsonl")
    samples = _samples(RunLabels(r, {"run_id": "abc"}))
    assert samples and all(s.labels.get("run_id") == "abc" for s in samples)
    info = [s.labels for s in samples if s.name == "replayer_run_info"]
    assert [i["target"] for i in info] == ["10.0.0.1:8000", "llm.example:443"]
    assert {i["model"] for i in info} == {"m"} and {i["shard"] for i in info} == {"1/4"}


def test_target_address_is_the_default_instance_of_its_scrape():
    assert target_address("http://127.0.0.1:8000") == "127.0.0.1:8000"
    assert target_address("http://vllm/v1") == "vllm:80"
    assert target_address("https://[::1]:9/") == "[::1]:9"
    assert target_address("host:7") == "host:7"


def test_events_are_kept_with_their_times_and_exported_per_kind():
    r = CollectorRegistry()
    t = [1000.0]
    ev = RunEvents(r, clock=lambda: t[0])
    ev.anchor_wall_s = 999.0
    ev.record("start")
    t[0] = 1005.5
    ev.record("speedup", speedup=20.0)
    t[0] = 1010.0
    ev.record("loop", loop=1)
    t[0] = 1020.0
    ev.record("loop", loop=2)
    with pytest.raises(ValueError, match="unknown run event"):
        ev.record("nap")
    assert ev.as_list()[1] == {"event": "speedup", "time_s": 1005.5, "t_s": 6.5, "speedup": 20.0}
    v = {(s.name, s.labels.get("event")): s.value for s in _samples(r)}
    assert v[("replayer_run_events_total", "loop")] == 2 and v[("replayer_run_events_total", "pause")] == 0
    assert {e for n, e in v if n == "replayer_run_events_total"} == set(EVENTS)  # every kind from the start
    assert v[("replayer_run_event_timestamp_seconds", "loop")] == 1020.0  # the last one
    assert ("replayer_run_event_timestamp_seconds", "pause") not in v  # absent until it happened


def test_a_new_loop_and_the_warmup_end_are_events():
    r = CollectorRegistry()
    m = ReplayerMetrics(r)
    m.set_loop(0)
    m.set_loop(1, start_trace_ns=5)
    seen = []
    hook = m.events.after_warmup(seen.append)
    for warm in (True, True, False, False):
        hook(RequestResult(row=0, warmup=warm))
    assert [e["event"] for e in m.events.as_list()] == ["loop", "warmup_end"] and len(seen) == 4


def test_the_live_window_gives_the_summarys_exact_quantiles_of_its_last_seconds():
    t = [0.0]
    w = LiveWindow(None, window_s=60, slots=6, clock=lambda: t[0])
    rng = np.random.default_rng(1)
    old = rng.lognormal(0, 1, 500)
    new = rng.lognormal(1, 1, 700)
    for v in old:
        w.on_result(RequestResult(row=0, outcome="success", ttft_ms=float(v)))
    w.on_result(RequestResult(row=0, outcome="failed", ttft_ms=1e9))  # failed: never in
    t[0] = 70.0  # the old slot has left the window
    for v in new:
        w.on_result(RequestResult(row=0, outcome="success", ttft_ms=float(v), itl_ms=[float(v), 2 * float(v)]))
    want = Stat()
    want.add(new / 1e3)
    got = {(s.labels["metric"], s.labels.get("percentile")): s.value for s in _samples_of(w)}
    assert got[("ttft", "p99")] == want.percentile(99) and got[("ttft", "p50")] == want.percentile(50)
    assert got[("ttft", None)] == 700 and got[("itl", None)] == 1400
    assert ("tpot", "p99") not in got and got[("tpot", None)] == 0  # unknown, never 0
    t[0] = 200.0  # nothing in the window: no quantile
    assert not [s for s in _samples_of(w) if s.name == "replayer_live_latency_seconds"]


def _samples_of(collector) -> list:
    r = CollectorRegistry()
    r.register(collector)
    return _samples(r)


@pytest.mark.parametrize("buckets", [LATENCY_BUCKETS, TOKEN_LATENCY_BUCKETS])
def test_fine_buckets_keep_histogram_quantile_within_3_percent_of_the_exact_percentile(buckets):
    rng = np.random.default_rng(7)
    lo = 0.006 if buckets is LATENCY_BUCKETS else 0.0012
    for scale in (1, 10, 100):
        v = lo * scale * rng.lognormal(0, 0.6, 3000)
        v = v[v < buckets[-1] / 10]
        h = BatchedHistogram("x", "x", buckets, None)
        h.observe_many(v)
        st = Stat()
        st.add(v)
        bounds, cum = h.cumulative()
        for q in (0.5, 0.9, 0.99):
            est = quantile_from_buckets(q, bounds, cum)
            exact = st.percentile(q * 100)
            assert est == pytest.approx(exact, rel=0.03), (scale, q)


def test_linger_defaults_to_nothing_when_no_one_scraped_and_ends_once_the_scraper_came_back():
    class Seen:
        scrapers: dict = {}
        scrape_jobs: set = set()

    assert linger_for(None, Seen()) == 0.0 and linger_for(5.0, Seen()) == 5.0

    def scrape(url: str) -> None:  # as Prometheus does
        req = urllib.request.Request(url + "/metrics", headers={"X-Prometheus-Scrape-Timeout-Seconds": "1"})
        urllib.request.urlopen(req).read()

    async def main() -> tuple[str, float]:
        reg = CollectorRegistry()
        admin = AdminServer(RunLabels(reg, {"run_id": "r"}), status=dict, ready=lambda: True)
        url = await admin.start()
        loop = asyncio.get_running_loop()
        for _ in range(2):  # a curl, however often, is not a scraper to wait for
            await loop.run_in_executor(None, lambda: urllib.request.urlopen(url + "/metrics").read())
        assert set(admin.scrapers) and linger_for(None, admin) == 0.0
        await loop.run_in_executor(None, scrape, url)
        assert linger_for(None, admin) == DEFAULT_LINGER_S
        t0 = time.monotonic()
        later = loop.call_later(0.5, lambda: loop.run_in_executor(None, scrape, url))
        why = await linger(admin, 20.0)
        later.cancel()
        await admin.stop()
        return why, time.monotonic() - t0

    why, took = asyncio.run(main())
    assert why == "scraped" and took < 15


def test_linger_ends_after_its_time_without_a_scrape():
    class Seen:
        scrapers = {("h", "a"): 0.0}
        scrape_jobs = {("h", "a")}

    t0 = time.monotonic()
    assert asyncio.run(linger(Seen(), 0.3)) == "time" and time.monotonic() - t0 >= 0.3


@pytest.mark.skipif(shutil.which("prometheus-pushgateway") is None, reason="needs prometheus-pushgateway (apt-get)")
def test_push_once_reaches_a_real_pushgateway(tmp_path):
    port = free_port()
    p = subprocess.Popen(
        ["prometheus-pushgateway", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", 20)
        r = CollectorRegistry()
        m = ReplayerMetrics(r, process_collector=False)
        m.sent.inc(42)
        assert push_once(f"http://127.0.0.1:{port}", RunLabels(r, {"run_id": "run-9"}), run_id="run-9", instance="h:1")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        line = next(x for x in text.splitlines() if x.startswith("replayer_requests_sent_total{"))
        assert 'run_id="run-9"' in line and 'job="replayer"' in line and line.endswith(" 42")
        assert not push_once(f"http://127.0.0.1:{free_port()}", RunLabels(r, {}), run_id="x", instance="h:1")
    finally:
        p.terminate()
        p.wait(10)


def test_every_row_of_the_table_is_an_attribute_of_its_kind():
    from prometheus_client import Counter, Gauge, Histogram, Info

    from replayer.observe.metrictable import METRICS

    m = ReplayerMetrics(CollectorRegistry())
    kinds = {"counter": Counter, "gauge": Gauge, "info": Info, "histogram": Histogram, "batched": BatchedHistogram}
    for spec in METRICS:
        assert isinstance(getattr(m, spec.attr), kinds[spec.kind]), spec.attr
        assert ReplayerMetrics.__annotations__[spec.attr] == kinds[spec.kind].__name__, spec.attr
    assert len({s.name for s in METRICS}) == len(METRICS) == len({s.attr for s in METRICS})
