"""A load without a trace file: ``replayer run --request-rate R [--burstiness B] --num-prompts N
--input-len L --output-len O [--prefix-len P]`` (vllm bench serve's names): its arrivals against
their definitions, its rows, and a real run (and its resume) against the simulator."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from replayer.cli import build_parser, flags_for, main
from replayer.config import ConfigError, load_config
from replayer.results import read_results
from replayer.trace.synth import SynthSource, load_spec, synth

ROWS = 40_000
RATE = 50.0


def _gaps_s(burstiness: float, rate: float = RATE, rows: int = ROWS) -> np.ndarray:
    spec = load_spec(
        num_prompts=rows, request_rate=rate, burstiness=burstiness, input_len=8, output_len=2, block_size=16, seed=3
    )
    ts = np.concatenate([b.timestamp_ns for b in SynthSource(spec).batches()])
    assert ts[0] == 0 and ts.size == rows  # the first request at time 0
    return np.diff(ts) / 1e9


@pytest.mark.parametrize("burstiness", [1.0, 4.0, 0.25])
def test_gamma_gaps_have_mean_one_over_the_rate_and_cv_one_over_sqrt_burstiness(burstiness):
    """vLLM's intervals: gamma(shape=B, scale=1/(R*B)): mean 1/R, coefficient of variation
    1/sqrt(B) (1 for B = 1: Poisson). 40,000 gaps: the mean's standard error is below 0.5 %."""
    gaps = _gaps_s(burstiness)
    assert gaps.mean() == pytest.approx(1 / RATE, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)
    assert (gaps >= 0).all()


def test_burstiness_one_is_poisson_exponential_gaps():
    """Poisson arrivals: the gaps are exponential, P(gap > t) = exp(-R t)."""
    gaps = _gaps_s(1.0)
    for t in (0.5 / RATE, 1 / RATE, 2 / RATE):
        assert (gaps > t).mean() == pytest.approx(math.exp(-RATE * t), abs=0.01)


@pytest.mark.parametrize("rate", [RATE, 3.0, 7.5])
def test_an_infinite_burstiness_spaces_requests_exactly_one_over_the_rate(rate):
    spec = load_spec(num_prompts=5000, request_rate=rate, burstiness=math.inf, input_len=8, output_len=2, block_size=16)
    ts = np.concatenate([b.timestamp_ns for b in SynthSource(spec).batches(700)])
    k = np.arange(5000)
    assert (ts == np.round(k * 1e9 / rate).astype(np.int64)).all()  # row k at k/R, never drifting
    assert set(np.diff(ts).tolist()) <= {math.floor(1e9 / rate), math.ceil(1e9 / rate)}
    assert SynthSource(spec).span_ns() == ts[-1]


def test_an_infinite_rate_sends_everything_at_once():
    for b in (1.0, 4.0, math.inf):
        spec = load_spec(num_prompts=100, request_rate=math.inf, burstiness=b, input_len=8, output_len=2, block_size=16)
        assert not np.concatenate([x.timestamp_ns for x in SynthSource(spec).batches()]).any()


def test_rows_have_the_lengths_and_a_shared_prefix_in_hash_ids():
    """Prompt = prefix_len + input_len tokens; the prefix's whole blocks carry the same hash ids in
    every row (the prefix cache sees them), everything after is each row's own."""
    spec = load_spec(
        num_prompts=300, request_rate=10, input_len=100, output_len=7, prefix_len=40, block_size=16, seed=1
    )
    t = synth(spec)
    assert (t.input_length == 140).all() and (t.output_length == 7).all()
    rows = [t.hash_values[t.hash_offsets[i] : t.hash_offsets[i + 1]].tolist() for i in range(len(t))]
    assert all(len(r) == 9 for r in rows)  # ceil(140 / 16)
    assert {tuple(r[:2]) for r in rows} == {(0, 1)}  # 40 tokens: 2 whole blocks shared
    own = [h for r in rows for h in r[2:]]
    assert len(own) == len(set(own))  # the 3rd block (tokens 32..47) is already the row's own
    # rows do not depend on the batch size they are served in
    a = np.concatenate([b.hash_values for b in SynthSource(spec).batches(7)])
    assert (a == t.hash_values).all()
    ranged = synth(
        load_spec(num_prompts=2000, request_rate=10, input_len=100, output_len=10, range_ratio=0.5, block_size=16)
    )
    assert ranged.input_length.min() >= 50 and ranged.input_length.max() <= 150  # vLLM's [L(1-r), L(1+r)]
    assert ranged.output_length.min() >= 5 and ranged.output_length.max() <= 15
    assert len(set(ranged.input_length.tolist())) > 50


def test_trace_synth_writes_the_same_rows_to_a_file(tmp_path):
    """`trace synth` stays the way to write such a load to a file: with the matching flags
    (cv = 1/sqrt(burstiness), one system prompt of --prefix-len tokens) it writes the same rows."""
    from replayer.trace import read_trace

    out = tmp_path / "s.parquet"
    flags = ["--rows", "500", "--rate", "10", "--arrival", "gamma", "--cv", "0.5", "--seed", "2"]
    lengths = ["--input-dist", "const:100", "--output-dist", "const:7", "--block-size", "16"]
    prefix = ["--system-prompts", "1", "--system-prompt-tokens", "40"]
    assert main(["trace", "synth", "-o", str(out), *flags, *lengths, *prefix]) == 0
    written = read_trace(out)
    load = {"request_rate": 10, "burstiness": 4, "num_prompts": 500, "input_len": 100, "output_len": 7}
    cfg = load_config({**load, "prefix_len": 40, "seed": 2})
    made = synth(cfg.synthetic_spec())
    assert (written.timestamp_ns == made.timestamp_ns).all()
    assert (written.hash_values == made.hash_values).all() and (written.input_length == made.input_length).all()


def test_a_trace_and_a_request_rate_together_are_refused(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    with pytest.raises(ConfigError, match="--request-rate makes a synthetic load, and a TRACE is given too"):
        load_config({"trace": str(trace), "request_rate": 5})
    with pytest.raises(ConfigError, match="--num-prompts, --prefix-len: only for a synthetic load"):
        load_config({"trace": str(trace), "num_prompts": 5, "prefix_len": 3})
    with pytest.raises(ConfigError, match="give a TRACE to replay, or --request-rate R"):
        load_config({})
    assert main(["run", str(trace), "--request-rate", "5"]) == 2
    err = capsys.readouterr().err
    assert "--request-rate makes a synthetic load" in err and "Traceback" not in err


def test_sweep_and_workers_pass_a_synthetic_load_on_and_no_synthetic_flag_with_a_trace(tmp_path):
    """The points of a sweep and the workers get the run's settings as flags (``flags_for``)."""
    cfg = load_config({"request_rate": math.inf, "burstiness": 4, "num_prompts": 9, "prefix_len": 32})
    flags = flags_for(cfg, set())
    again = build_parser().parse_args(["run", *flags])
    assert load_config({k: v for k, v in vars(again).items() if k in type(cfg).model_fields}) == cfg
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    flags = flags_for(load_config({"trace": str(trace)}), set())
    assert "--num-prompts" not in flags and "--burstiness" not in flags


def _replayer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "replayer", "run", *args, "--admin-port", "0", "--quiet"],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_synthetic_load_against_the_simulator_then_resumed_from_its_recorded_settings(tmp_path, sim_process):
    """A real short run (the embedded simulator), cut by --duration; then --resume alone
    regenerates the same schedule from the seed and settings in the folder and sends the rest:
    every row once, the exact prompts (prefix shared, the rest each request's own)."""
    res = tmp_path / "r"
    load = ["--request-rate", "40", "--num-prompts", "40", "--input-len", "100", "--output-len", "4"]
    p = _replayer(*load, "--prefix-len", "32", "--seed", "5", "--duration", "0.4", "--results", str(res))
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((res / "summary.json").read_text())
    assert s["trace"] is None and s["target_embedded"] is True
    assert s["synthetic_load"] == {
        "request_rate": 40.0,
        "burstiness": 1.0,
        "arrival": "poisson",
        "num_prompts": 40,
        "input_len": 100,
        "output_len": 4,
        "range_ratio": 0.0,
        "prefix_len": 32,
        "prefix_shared_tokens": 32,
        "block_size": 16,
        "seed": 5,
    }
    cfg = load_config(
        {"request_rate": 40, "num_prompts": 40, "input_len": 100, "output_len": 4, "prefix_len": 32, "seed": 5}
    )
    ts = np.concatenate([b.timestamp_ns for b in SynthSource(cfg.synthetic_spec()).batches()])
    first = int(np.count_nonzero(ts < 0.4e9))  # the rows due before --duration
    assert 0 < first < 40
    assert s["scheduled"] == s["sent"] == s["completed"] == first
    assert s["total_input_tokens"] == 132 * first and s["total_output_tokens"] == 4 * first
    assert s["expected_prefix_hit_tokens"] == 32 * (first - 1)  # every request after the first
    assert "Synthetic load (no trace)" in p.stdout and "40 requests, Poisson at 40 req/s" in p.stdout

    # another rate is another schedule: refused
    p = _replayer("--resume", str(res), "--request-rate", "30")
    assert p.returncode == 2 and "--request-rate 40.0 there, 30.0 now" in p.stderr, p.stderr[-2000:]
    # --resume alone: the same load from the recorded settings
    assert load_config({"resume": str(res)}).synthetic_spec() == cfg.synthetic_spec()
    url, received = sim_process()
    p = _replayer("--resume", str(res), "--target", url)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_results(str(res)).to_pylist()
    assert sorted(r["row"] for r in rows) == list(range(40)) and {r["outcome"] for r in rows} == {"success"}
    later = sorted((r for r in rows if r["row"] >= first), key=lambda r: r["row"])
    due = np.array([r["due_ns"] for r in later])
    assert (np.diff(due) == np.diff(ts[first:])).all()  # the same schedule (rebased on its first row)
    s = json.loads((res / "summary.json").read_text())
    assert s["completed"] == 40 and s["synthetic_load"]["seed"] == 5
    prompts = [json.loads(line)["prompt"] for line in received.read_text().splitlines()]
    assert len(prompts) == 40 - first and all(len(x) == 132 for x in prompts)
    assert len({tuple(x[:32]) for x in prompts}) == 1 and len({tuple(x[32:48]) for x in prompts}) == len(prompts)


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--arrival", "gamma", "--cv", "1e-200"], "--cv must be between 1e-06 and 100"),  # cv^2 underflowed: 1/0
        (["--arrival", "gamma", "--cv", "1e200"], "--cv must be between 1e-06 and 100"),  # cv^2 overflowed: 1/0
        (["--arrival", "gamma", "--cv", "nan"], "--cv must be between"),
        (["--rate", "1e-300"], "--rate 1e-300 is too slow: 5 rows would span 5e+300 s"),  # wrapped to < 0
        (["--input-dist", "lognormal:100:1e200"], "parameters must be at most 1,000,000,000 tokens"),
        (["--input-dist", "lognormal:100:101"], "CV must be at most 100"),
        (["--input-dist", "lognormal:1e300:1"], "parameters must be at most"),
        (["--input-dist", "uniform:1:1e30"], "parameters must be at most"),
        (["--input-dist", "normal:10:1e12"], "parameters must be at most"),
        (["--system-prompts", "1", "--system-prompt-tokens", "2000000000"], "must be at most 1,000,000,000"),
    ],
)
def test_trace_synth_checks_the_range_of_every_distribution_parameter(tmp_path, flags, says):
    """A tiny or huge --cv raised ZeroDivisionError or wrote negative timestamps with exit 0."""
    out = tmp_path / "s.parquet"
    argv = ["trace", "synth", "-o", str(out), "--rows", "5", "--rate", "1", "--output-dist", "const:5"]
    r = subprocess.run([sys.executable, "-m", "replayer", *argv, *flags], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not out.exists()


def test_gamma_at_the_ends_of_its_range_writes_sorted_times_from_0(tmp_path):
    from replayer.trace.synth import MAX_CV, MIN_CV, SynthSpec

    for cv in (MIN_CV, MAX_CV):
        t = synth(
            SynthSpec(rows=200, rate_per_s=1.0, arrival="gamma", cv=cv, input_dist="const:4", output_dist="const:1")
        )
        ts = t.timestamp_ns
        assert ts[0] == 0 and (np.diff(ts) >= 0).all()


@pytest.mark.parametrize(
    "settings, says",
    [
        ({"burstiness": 1e-300}, "burstiness: must be between 0.0001 and 1e+12, or inf"),
        ({"request_rate": 1e-300}, "request_rate (--request-rate) 1e-300 is too slow"),  # all sent at once
        ({"input_len": 10**12}, "input_len (--input-len, --range-ratio): bad distribution"),
    ],
)
def test_a_synthetic_load_checks_its_ranges(settings, says):
    with pytest.raises(ConfigError) as ei:
        load_config({"request_rate": 10, "num_prompts": 5, **settings})
    assert says in str(ei.value)
