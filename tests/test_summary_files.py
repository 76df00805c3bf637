"""The end-of-run summary of a long soak in bounded memory: counts exact, statistics sampled."""

import numpy as np
import pyarrow.parquet as pq

from replayer.result import RequestResult, to_table
from replayer.summary import summarize, summarize_files


def _results(n: int, seed: int) -> list[RequestResult]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ok = rng.random() > 0.05
        sent = i * 1_000_000
        ttft = float(rng.lognormal(3, 0.5))
        out.append(RequestResult(row=i, input_length=100, output_length=4, due_ns=sent, sent_ns=sent,
                                 end_ns=sent + 50_000_000, outcome="success" if ok else "failed",
                                 error_kind="none" if ok else "http_status", prompt_tokens=100 if ok else None,
                                 completion_tokens=4 if ok else None, ttft_ms=ttft if ok else None,
                                 e2e_ms=ttft + 30 if ok else None, tpot_ms=10.0 if ok else None,
                                 dispatch_lag_ms=float(rng.random()), itl_ms=[10.0, 10.0, 10.0] if ok else []))
    return out


def test_sampled_summary_keeps_counts_exact_and_percentiles_close(tmp_path):
    files = []
    every = []
    for k in range(3):
        rs = _results(4000, k)
        every += rs
        f = tmp_path / f"requests-{k:05d}.parquet"
        pq.write_table(to_table(rs), f)
        files.append(str(f))
    whole = summarize(to_table(every))
    assert summarize_files(files) == whole                      # small: exactly the same
    s = summarize_files(files, sample_rows=3000, seed=1)
    for key in ("scheduled", "sent", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "errors_by_kind", "usage_missing", "prompt_token_mismatches"):
        assert s[key] == whole[key], key
    assert s["duration"] == whole["duration"]
    assert s["request_throughput"] == whole["request_throughput"]
    assert 2500 < s["statistics_sample_rows"] < 3500
    assert abs(s["median_ttft_ms"] - whole["median_ttft_ms"]) / whole["median_ttft_ms"] < 0.05
    assert s["median_itl_ms"] == whole["median_itl_ms"] == 10.0


def test_printed_summary_says_a_stop_and_the_prefix_cache():
    from replayer.summary import format_summary

    s = summarize(to_table(_results(2000, 3)))
    plain = format_summary(s)
    assert "Stopped early" not in plain and "Prefix cache" not in plain
    assert "Scheduled requests" in plain and "2,000" in plain  # thousands separated
    s.update(stopped_early=True, stop_signal="SIGTERM", expected_prefix_hit_tokens=1_234_560,
             server_prefix_cache_hit_tokens=1_000_448.0)
    lines = format_summary(s).splitlines()
    assert lines[1].startswith("Stopped early") and lines[1].endswith("by SIGTERM")
    assert next(x for x in lines if x.startswith("Expected from hash ids / server-reported")).endswith(
        "1,234,560 / 1,000,448")
