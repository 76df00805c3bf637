"""Each engine's ``/metrics`` page (``tests/fixtures/engines``: SGLang's is a real page from its
docs, the others are built from the engines' metric definitions, each file says which) read in
its dialect into replayer's canonical values; the engine told from the page; unknowns left out
(never 0); a rate gauge never summed; the simulator's pages read back the same way."""

from __future__ import annotations

import asyncio
import pathlib

import aiohttp
import pytest

from replayer.core.engines import ENGINES, engine_caps
from replayer.observe import TargetScraper
from replayer.observe.dialects import DIALECTS, dialect
from replayer.observe.dialects.detect import engine_from_info, engine_from_metrics, engine_from_models
from replayer.observe.target_series import parse_metrics, parse_series, series_deltas
from replayer.sim import SimConfig, SimServer

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "engines"

#: what each fixture page must read as (canonical name -> value; None: must be absent)
EXPECTED: dict[str, dict[str, float | None]] = {
    "vllm": {
        "prompt_tokens": 6144,
        "generation_tokens": 960,
        "request_success": 12,
        "prefix_cache_queries": 6144,
        "prefix_cache_hits": 4096,
        "prefix_cache_hit_rate": 4096 / 6144,
        "kv_cache_usage_perc": 0.375,  # the mean over engines, never the sum
        "num_requests_running": 5,
        "num_requests_waiting": 1,
        "num_preemptions": 3,
        "spec_decode_acceptance_rate": 0.5,
        "spec_decode_mean_acceptance_length": 2.5,
        "server_mean_ttft_seconds": 0.1,
        "server_mean_itl_seconds": 0.02,
        "server_mean_e2e_seconds": 2.0,
        "server_mean_queue_seconds": 0.05,
    },
    "sglang": {  # the real page of its docs
        "prompt_tokens": 8128902,
        "generation_tokens": 7557572,
        "kv_cache_usage_perc": 0.28,
        "server_prefix_cache_hit_rate": 0.007507552643049313,  # a rate: read as is
        "prefix_cache_hits": None,  # (no cached_tokens_total in that release)
        "prefix_cache_queries": 8128902,  # = the prompt tokens (alias)
        "num_requests_running": 162,
        "num_requests_waiting": 2826,
        "server_ttft_seconds_count": 11008,
        "server_mean_ttft_seconds": 2.3518979474117756e06 / 11008,
        "server_mean_itl_seconds": 866964.5791549598 / 7.400757e06,
        "server_mean_e2e_seconds": 3.116093850019932e06 / 11228,
        "num_preemptions": None,
    },
    "tgi": {
        "prompt_tokens": 9000,
        "generation_tokens": 1100,
        "request_success": 11,
        "num_requests_running": 8,
        "num_requests_waiting": 4,
        "spec_decode_num_accepted_tokens": 30,
        "server_mean_e2e_seconds": 2.0,
        "server_mean_queue_seconds": 0.1,
        "server_mean_itl_seconds": 0.02,
        "kv_cache_usage_perc": None,
        "prefix_cache_hits": None,
        "server_ttft_seconds_sum": None,
    },
    "trtllm": {
        "prompt_tokens": 5000,
        "generation_tokens": 800,
        "request_success": 10,
        "prefix_cache_hits": 2048,
        "prefix_cache_queries": 5000,
        "prefix_cache_hit_rate": 2048 / 5000,
        "server_prefix_cache_hit_rate": 0.4,
        "kv_cache_usage_perc": 0.35,
        "num_requests_running": 6,
        "num_requests_waiting": 2,
        "spec_decode_acceptance_rate": 0.25,
        "server_spec_decode_acceptance_length": 1.25,
        "server_mean_ttft_seconds": 0.05,
        "server_mean_itl_seconds": 0.02,
        "num_preemptions": None,
    },
    "dynamo": {
        "prompt_tokens": 23000,
        "generation_tokens": 2010,  # output_tokens_total, preferred to the histogram's sum
        "request_success": 20,  # status="success" only
        "prefix_cache_hits": 11500,
        "prefix_cache_queries": 23000,
        "prefix_cache_hit_rate": 0.5,
        "kv_cache_usage_perc": 400 / 2000,  # active / total blocks
        "num_requests_running": 5,
        "num_requests_waiting": 2,
        "server_mean_ttft_seconds": 0.1,
        "server_mean_itl_seconds": 0.01,
        "server_mean_e2e_seconds": 2.0,
        "num_preemptions": None,
    },
    "llamacpp": {
        "prompt_tokens": 6886,
        "generation_tokens": 3469,
        "kv_cache_usage_perc": 0.42,
        "num_requests_running": 3,
        "num_requests_waiting": 1,
        "request_success": None,
        "prefix_cache_hits": None,
        "server_ttft_seconds_sum": None,
    },
}


def _page(engine: str) -> str:
    return (FIXTURES / f"{engine}.metrics.txt").read_text()


@pytest.mark.parametrize("engine", ENGINES)
def test_each_engines_page_reads_as_the_canonical_values(engine):
    got = parse_metrics(_page(engine), dialect(engine))
    for name, want in EXPECTED[engine].items():
        if want is None:
            assert name not in got, name  # unknown: left out, never 0
        else:
            assert got.get(name) == pytest.approx(want), name


@pytest.mark.parametrize("engine", ENGINES)
def test_the_engine_is_told_from_its_page(engine):
    assert engine_from_metrics(_page(engine)) == engine


def test_a_page_read_in_another_dialect_yields_nothing():
    assert parse_metrics(_page("sglang"), dialect("vllm")) == {}
    assert "prompt_tokens" not in parse_metrics(_page("vllm"), dialect("llamacpp"))


def test_other_detection_clues():
    assert engine_from_metrics("# only comments\n") is None
    dyn = _page("dynamo") + 'vllm:num_requests_running{engine="0"} 1\n' * 50  # (engine names passed through)
    assert engine_from_metrics(dyn) == "dynamo"
    assert engine_from_models({"data": [{"id": "m", "owned_by": "sglang"}]}) == "sglang"
    assert engine_from_models({"data": [{"id": "m", "owned_by": "m"}]}) is None
    assert engine_from_info("/server_info", {"tp_size": 1, "model_path": "x"}) == "sglang"
    assert engine_from_info("/info", {"router": "text-generation-router", "model_id": "x"}) == "tgi"


def test_a_rate_gauge_is_never_summed_into_the_runs_deltas():
    """SGLang's cache_hit_rate is a gauge: the run's deltas (counters only) never hold it."""
    d = dialect("sglang")
    sc = TargetScraper("http://unused/metrics", dialect=d)
    page = _page("sglang")
    sc.observe(page)
    sc.observe(page.replace("8.128902e+06", "8.128912e+06").replace("0.007507552643049313", "0.5"))
    deltas = sc.deltas()
    assert deltas["prompt_tokens"] == pytest.approx(10) and "server_prefix_cache_hit_rate" not in deltas
    assert sc.latest["server_prefix_cache_hit_rate"] == 0.5
    assert "prefix_cache_hits" in sc.unknown_nulls("counter") or "prefix_cache_hits" in sc.missing


def test_dynamo_counts_only_successful_requests():
    values, _ = parse_series(_page("dynamo"), dialect("dynamo"))
    assert all(dict(labels).get("status") != "error" for _, labels in values)
    before = dict(values)
    after = {k: v + 1 for k, v in values.items()}
    assert all(v == 1 for v in series_deltas(before, after, dialect=dialect("dynamo")).values())


def test_every_dialect_cites_its_source_and_every_engine_has_one():
    assert set(DIALECTS) == set(ENGINES)
    for d in DIALECTS.values():
        assert "@" in d.source and d.counters and d.gauges
        assert {"num_requests_running", "num_requests_waiting"} <= set(d.gauges)
        assert engine_caps(d.name).name == d.name


@pytest.mark.parametrize("engine", ENGINES)
def test_the_simulator_serves_each_engines_page_at_its_path(engine):
    async def main():
        sim = SimServer(SimConfig(engine=engine))
        url = await sim.start()
        try:
            async with aiohttp.ClientSession() as c:
                async with c.get(url + engine_caps(engine).metrics_path) as r:
                    text = await r.text()
                async with c.get(url + "/v1/models") as r:
                    models = await r.json()
            return text, models
        finally:
            await sim.stop()

    text, models = asyncio.run(main())
    assert engine_from_metrics(text) == engine
    got = parse_metrics(text, dialect(engine))
    assert got["num_requests_running"] == 0 and got["prompt_tokens"] == 0
    owner = engine_caps(engine).owned_by
    assert engine_from_models(models) == (engine if owner else None)
