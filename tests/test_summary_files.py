"""The end-of-run summary of a long soak in bounded memory: counts exact, statistics folded batch by batch."""

import numpy as np
import pyarrow.parquet as pq
import pytest

from replayer.core import RequestResult
from replayer.core.result import to_table
from replayer.results import summarize, summarize_files


def _results(n: int, seed: int) -> list[RequestResult]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ok = rng.random() > 0.05
        sent = i * 1_000_000
        ttft = float(rng.lognormal(3, 0.5))
        out.append(
            RequestResult(
                row=i,
                input_length=100,
                output_length=4,
                due_ns=sent,
                sent_ns=sent,
                end_ns=sent + 50_000_000,
                outcome="success" if ok else "failed",
                error_kind="none" if ok else "http_status",
                prompt_tokens=100 if ok else None,
                completion_tokens=4 if ok else None,
                ttft_ms=ttft if ok else None,
                e2e_ms=ttft + 30 if ok else None,
                ttft_from_due_ms=ttft if ok else None,  # sent at due: derive's from-due values
                e2el_from_due_ms=ttft + 30 if ok else None,
                tpot_ms=10.0 if ok else None,
                dispatch_lag_ms=float(rng.random()),
                itl_ms=[10.0, 10.0, 10.0] if ok else [],
            )
        )
    return out


def test_folded_summary_keeps_counts_exact_and_statistics_within_the_sketch_error(tmp_path, monkeypatch):
    import replayer.core.stats as stats
    import replayer.results.summary as summary

    files = []
    every = []
    for k in range(3):
        rs = _results(4000, k)
        every += rs
        f = tmp_path / f"requests-{k:05d}.parquet"
        pq.write_table(to_table(rs), f, row_group_size=1000)
        files.append(str(f))
    whole = summarize(to_table(every))
    monkeypatch.setattr(summary, "BATCH_ROWS", 700)  # many batches per file, folded one by one
    for limit in (stats.EXACT_LIMIT, 1000):  # percentiles exact, then from the sketch
        monkeypatch.setattr(stats, "EXACT_LIMIT", limit)
        s = summarize_files(files)
        assert set(s) == set(whole) and "statistics_sample_rows" not in s
        for key, v in whole.items():
            if key in ("percentiles_sketched",):
                continue
            if isinstance(v, float) and not key.startswith(("median_", "p50_", "p90_", "p99_", "dispatch_lag_p")):
                assert s[key] == pytest.approx(v, rel=1e-12), key  # mean, std, max, throughputs: exact
            elif isinstance(v, float):
                rel = 0 if limit > 12_000 else stats.RELATIVE_ACCURACY
                assert s[key] == pytest.approx(v, rel=rel * (1 + 1e-9)), key
            else:
                assert s[key] == v, key  # every count, token total and error kind
        assert s["median_itl_ms"] == whole["median_itl_ms"] == 10.0
    assert s["percentiles_sketched"] == [
        "ttft_ms",
        "tpot_ms",
        "itl_ms",
        "e2el_ms",
        "ttft_from_due_ms",
        "e2el_from_due_ms",
        "dispatch_lag_ms",
    ]
    assert whole["percentiles_sketched"] == []


def test_printed_summary_says_a_stop_and_the_prefix_cache():
    from replayer.results.summary import format_summary

    s = summarize(to_table(_results(2000, 3)))
    plain = format_summary(s)
    assert "Stopped early" not in plain and "Prefix cache" not in plain
    assert "Scheduled requests" in plain and "2,000" in plain  # thousands separated
    s.update(
        stopped_early=True,
        stop_signal="SIGTERM",
        expected_prefix_hit_tokens=1_234_560,
        server_prefix_cache_hit_tokens=1_000_448.0,
    )
    for name in ("server_queue_time_ms", "server_time_to_first_token_ms", "server_generation_time_ms"):
        s.update({f"{k}_{name}": 1.0 for k in ("mean", "median", "p99")})
    s.update(client_overhead_ms_count=3, mean_client_overhead_ms=286.06, median_client_overhead_ms=339.52)
    s.update(p99_client_overhead_ms=422.72)
    lines = format_summary(s).splitlines()
    # a long label ran into its numbers: "...server TTFT)286.06 / 339.52 / 422.72"
    assert next(x for x in lines if x.startswith("Client overhead")).endswith(")  286.06 / 339.52 / 422.72")
    assert lines[1].startswith("Stopped early") and lines[1].endswith("by SIGTERM")
    assert next(x for x in lines if x.startswith("Expected from hash ids / server-reported")).endswith(
        "1,234,560 / 1,000,448"
    )


def test_printed_summary_warns_when_the_replayer_fell_behind():
    """Past the self-watch's bound (dispatch lag p99 above 50 ms) the latencies measured from the
    due time include the client's own delay: the printed summary says so, below it nothing."""
    from replayer.results.summary import format_summary

    s = summarize(to_table(_results(100, 3)))
    for p99, warned in ((None, False), (12.0, False), (50.0, False), (69.0, True)):
        s["dispatch_lag_p99_ms"] = p99
        lines = [x for x in format_summary(s).splitlines() if "FELL BEHIND" in x]
        assert len(lines) == warned
        if warned:
            assert "lag p99 > 50 ms" in lines[0] and "late on the client side" in lines[0]
