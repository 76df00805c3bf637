"""inspect (against an independent pandas computation), slice, scale, synth and the CLI wiring."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from replayer.cli import main as cli_main
from replayer.results.traceinspect import inspect_trace
from replayer.trace import read_trace, write_parquet
from replayer.trace.synth import SynthSpec, synth, write_synth
from replayer.trace.tools import scale_trace, slice_trace

REPO = Path(__file__).resolve().parents[1]
SLICE = REPO / "traces" / "mooncake_conversation_10min.parquet"


def test_inspect_committed_slice_matches_pandas():
    s = inspect_trace(SLICE, cache_tokens=10**12, max_rows=400)  # several batches
    df = pq.read_table(SLICE).to_pandas()
    t_s = (df.timestamp - df.timestamp.min()) / 1000.0
    assert s["rows"] == len(df) == 1750
    assert s["span_s"] == pytest.approx(t_s.max())
    assert s["mean_rate_per_s"] == pytest.approx(len(df) / t_s.max())
    assert s["peak_rate_per_s"] == df.groupby(np.floor(t_s)).size().max()
    assert s["peak_rate_per_min"] == df.groupby(np.floor(t_s / 60)).size().max()
    assert s["timestamp_grid"] == ("1 s" if (df.timestamp % 1000 == 0).all() else "1 ms")
    for col in ("input_length", "output_length"):
        for q in (50, 90, 95, 99):
            assert s[col][f"p{q}"] == np.percentile(df[col], q, method="inverted_cdf"), (col, q)
        assert s[col]["max"] == df[col].max() and s[col]["mean"] == pytest.approx(df[col].mean())
    assert s["total_input_tokens"] == df.input_length.sum() and s["total_output_tokens"] == df.output_length.sum()
    assert s["unique_blocks"] == df.hash_ids.explode().nunique()
    # the expected hits, computed independently: a block is its whole chain of ids (a tuple), it
    # remembers the most tokens any earlier row sent of it, a row's hits are its leading blocks'
    # tokens up to the first one sent shorter before, capped at input_length - 1 and cut to whole
    # 16-token KV blocks (replayer.payload.prefix_cache's docstring)
    sent: dict = {}
    hits = 0
    for ids, L in zip(df.hash_ids, df.input_length):
        sizes = [min(512, L - 512 * j) for j in range(len(ids))]
        matched = 0
        for j, n in enumerate(sizes):
            before = sent.get(tuple(ids[: j + 1]), 0)
            matched += min(before, n)
            if before < n:
                break
        h = min(matched, L - 1)
        hits += h - h % 16
        for j, n in enumerate(sizes):
            key = tuple(ids[: j + 1])
            sent[key] = max(sent.get(key, 0), n)
    assert s["expected_prefix_hit_tokens"] == hits
    assert s["expected_prefix_query_tokens"] == df.input_length.sum()
    assert s["prefix_hit_ratio"] == pytest.approx(hits / df.input_length.sum())
    small = inspect_trace(SLICE, cache_tokens=512 * 50)
    assert small["expected_prefix_hit_tokens"] < s["expected_prefix_hit_tokens"]
    # the default capacity (as replayer run's) holds the whole slice: the same hits
    assert inspect_trace(SLICE)["expected_prefix_hit_tokens"] == hits
    assert inspect_trace(SLICE, cache_tokens=None)["expected_prefix_hit_tokens"] == hits
    coarse = inspect_trace(SLICE, kv_block_size=128)
    assert coarse["kv_block_size"] == 128 and coarse["expected_prefix_hit_tokens"] < hits
    assert s["sessions"] is None


def _sessions_trace(tmp_path) -> Path:
    t = synth(
        SynthSpec(rows=600, rate_per_s=20, turns=3, sessions=5, system_prompts=2, system_prompt_tokens=1100, seed=5)
    )
    p = tmp_path / "sess.parquet"
    write_parquet(t, p, time_unit="ns")
    return p


def test_slice_window_head_sample_keep_sessions_whole(tmp_path):
    t = read_trace(_sessions_trace(tmp_path))
    by_sess = pd.Series(t.session_id).value_counts()
    for kw in ({"start_s": 3.0, "end_s": 9.0}, {"head": 37}, {"fraction": 0.4, "seed": 9}):
        out = slice_trace(t, **kw)
        counts = pd.Series(out.session_id).value_counts()
        assert (counts == by_sess[counts.index]).all(), kw  # every kept session is whole
        assert out.timestamp_ns[0] == 0 and (np.diff(out.timestamp_ns) >= 0).all()
        # rows keep their own lengths and ids
        src = {int(r): i for i, r in enumerate(t.source_row)}
        for i in range(len(out)):
            j = src[int(out.source_row[i])]
            assert out.input_length[i] == t.input_length[j] and out.hash_ids(i).tolist() == t.hash_ids(j).tolist()
    a = slice_trace(t, fraction=0.4, seed=9)
    assert a.session_id == slice_trace(t, fraction=0.4, seed=9).session_id
    assert a.session_id != slice_trace(t, fraction=0.4, seed=10).session_id
    assert 0.2 < len(set(a.session_id)) / len(by_sess) < 0.6
    cut = slice_trace(t, head=37, whole_sessions=False)
    assert len(cut) == 37
    with pytest.raises(ValueError):
        slice_trace(t, start_s=1e9)


def test_scale_times_lengths_and_consistent_ids():
    t = read_trace(SLICE)
    s = scale_trace(t, time_factor=0.5, input_factor=0.5, output_factor=2)
    assert (s.timestamp_ns == np.round(t.timestamp_ns * 0.5)).all()
    assert (s.output_length == t.output_length * 2).all()
    assert (s.input_length == np.maximum(1, np.round(t.input_length * 0.5))).all()
    assert (np.diff(s.hash_offsets) == (s.input_length + 511) // 512).all()
    read_trace_ok = s  # valid shape: a round trip through Parquet validates it
    del read_trace_ok
    # rule: new block j is shared iff the first ceil((j+1)/f) original ids are shared
    rng = np.random.default_rng(0)
    for _ in range(300):
        a, b = (int(x) for x in rng.integers(0, len(t), 2))
        ia, ib = t.hash_ids(a).tolist(), t.hash_ids(b).tolist()
        na, nb = s.hash_ids(a).tolist(), s.hash_ids(b).tolist()
        for j in range(min(len(na), len(nb))):
            m_a, m_b = min(len(ia), math.ceil((j + 1) / 0.5)), min(len(ib), math.ceil((j + 1) / 0.5))
            assert (na[j] == nb[j]) == (ia[:m_a] == ib[:m_b]), (a, b, j)
    # growing keeps sharing too, and factor 1 changes nothing
    g = scale_trace(t, input_factor=2.0)
    assert g.hash_ids(0)[:2].tolist() == g.hash_ids(1)[:2].tolist()  # rows 0, 1 share original block 0
    assert scale_trace(t).hash_values.tolist() == t.hash_values.tolist()
    with pytest.raises(ValueError):
        scale_trace(t, time_factor=0)


@pytest.mark.parametrize("arrival,cv", [("poisson", 1.0), ("gamma", 2.5)])
def test_synth_rate_seed_and_validity(tmp_path, arrival, cv):
    spec = SynthSpec(rows=20_000, rate_per_s=50.0, arrival=arrival, cv=cv, seed=11)
    t = synth(spec)
    rate = (len(t) - 1) / (t.duration_ns / 1e9)
    assert rate == pytest.approx(50.0, rel=0.05 * cv)
    gaps = np.diff(t.timestamp_ns) / 1e9
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(cv, rel=0.1)
    again = synth(spec)
    assert (
        again.timestamp_ns.tolist() == t.timestamp_ns.tolist() and again.hash_values.tolist() == t.hash_values.tolist()
    )
    assert (
        synth(SynthSpec(rows=20_000, rate_per_s=50.0, arrival=arrival, cv=cv, seed=12)).timestamp_ns.tolist()
        != t.timestamp_ns.tolist()
    )
    p = tmp_path / "s.parquet"
    assert write_synth(spec, p) == 20_000  # same chunking as synth(): same rows
    back = read_trace(p)  # passes validation (ceil(len / 512) ids, sorted)
    assert back.timestamp_ns.tolist() == t.timestamp_ns.tolist()
    assert write_synth(spec, p, row_group_rows=4096) == 20_000
    assert pq.ParquetFile(p).num_row_groups == 5 and len(read_trace(p)) == 20_000


def test_synth_prefix_sharing_and_multi_turn_growth():
    spec = SynthSpec(
        rows=240,
        rate_per_s=10,
        turns=4,
        sessions=6,
        system_prompts=3,
        system_prompt_tokens=1536,
        input_dist="const:300",
        output_dist="const:100",
        seed=2,
    )
    t = synth(spec)
    assert t.input_length[:6].tolist() == [1836] * 6  # turn 0: system prompt + 300 user tokens
    assert t.input_length[6:12].tolist() == [1836 + 400] * 6  # turn 1 resends the history
    for i in range(len(t)):
        assert t.hash_ids(i)[:3].max() < 9  # 3 full system-prompt blocks from 3 prompts
    # each turn's ids are a prefix of the next turn's (same session)
    for i in range(len(t) - 6):
        if t.session_id[i] == t.session_id[i + 6]:
            a, b = t.hash_ids(i).tolist(), t.hash_ids(i + 6).tolist()
            assert b[: len(a)] == a
    # different sessions share only system-prompt blocks
    assert set(t.hash_ids(0)[3:].tolist()).isdisjoint(t.hash_ids(1)[3:].tolist())


def test_cli_trace_subcommands(tmp_path, capsys):
    out = tmp_path / "s.parquet"
    assert (
        cli_main(
            [
                "trace",
                "synth",
                "-o",
                str(out),
                "--rows",
                "300",
                "--rate",
                "5",
                "--turns",
                "2",
                "--sessions",
                "3",
                "--seed",
                "1",
            ]
        )
        == 0
    )
    assert cli_main(["trace", "slice", str(out), "-o", str(tmp_path / "a.parquet"), "--sample", "0.5"]) == 0
    assert cli_main(["trace", "scale", str(out), "-o", str(tmp_path / "b.parquet"), "--input-factor", "1.5"]) == 0
    capsys.readouterr()
    assert cli_main(["trace", "inspect", str(tmp_path / "b.parquet"), "--json", "--cache-tokens", "100000"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["rows"] == 300 and s["sessions"] == 150 and s["prefix_hit_ratio"] is not None
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]}\n')
    assert cli_main(["trace", "inspect", str(bad)]) == 2
    assert f"{bad}: row 1: output_length" in capsys.readouterr().err
    assert cli_main(["trace", "convert", str(bad), "-o", str(tmp_path / "x.parquet")]) == 2
    assert not (tmp_path / "x.parquet").exists()


def test_inspect_into_a_closed_pipe_is_quiet():
    # `replayer trace inspect X | head -2`: the reader leaves early; no error, no traceback
    import subprocess
    import sys

    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayer",
            "trace",
            "inspect",
            str(Path(__file__).resolve().parents[1] / "traces" / "mooncake_conversation_10min.parquet"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(60) == 0 and err == ""


def test_arguments_that_would_be_ignored_are_errors(tmp_path, capsys):
    src = str(Path(__file__).resolve().parents[1] / "traces" / "mooncake_conversation_10min.parquet")
    cases = [
        (["slice", src, "-o", str(tmp_path / "x.csv"), "--head", "5"], "give a .parquet path"),
        (["slice", src, "-o", str(tmp_path / "x.parquet"), "--seed", "5"], "--seed only applies to --sample"),
        (["slice", src, "-o", str(tmp_path / "x.parquet"), "--start", "200", "--end", "100"], "must be before --end"),
        (
            ["synth", "-o", str(tmp_path / "x.parquet"), "--rows", "10", "--rate", "1", "--cv", "2"],
            "--cv only applies to --arrival gamma",
        ),
        (
            ["synth", "-o", str(tmp_path / "x.parquet"), "--rows", "10", "--rate", "1", "--input-dist", "const:0"],
            "--input-dist: bad distribution 'const:0': N must be >= 1",
        ),  # was turned into 1 without a word
        (
            ["synth", "-o", str(tmp_path / "x.parquet"), "--rows", "10", "--rate", "1", "--output-dist", "exp:0"],
            "--output-dist: bad distribution 'exp:0': MEAN must be > 0",
        ),
        (
            ["synth", "-o", str(tmp_path / "x.parquet"), "--rows", "10", "--rate", "inf"],
            "--rate must be a finite number > 0",
        ),  # named the field rate_per_s
        (
            ["scale", src, "-o", str(tmp_path / "x.parquet"), "--time-factor", "0"],
            "argument --time-factor: must be a positive number",
        ),  # named the function's time_factor
    ]
    for argv, msg in cases:
        capsys.readouterr()
        try:
            rc = cli_main(["trace", *argv])
        except SystemExit as e:  # (argparse's own errors)
            rc = e.code
        assert rc == 2, argv
        assert msg in capsys.readouterr().err, argv
        assert not list(tmp_path.iterdir()), argv  # nothing written
    assert (
        cli_main(
            [
                "trace",
                "synth",
                "-o",
                str(tmp_path / "g.parquet"),
                "--rows",
                "10",
                "--rate",
                "1",
                "--arrival",
                "gamma",
                "--cv",
                "2",
            ]
        )
        == 0
    )
