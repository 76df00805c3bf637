"""The verdict's pure core (replayer.results.verdict): --goodput parsing, per-request verdicts, the
summary fold, latency from the due time. No event loop."""

import numpy as np
import pytest

import replayer.results.verdict as verdict
from replayer.config import ConfigError, load_config
from replayer.core import RequestResult, Timestamps, derive
from replayer.core.result import to_table
from replayer.results import summarize
from replayer.results.summary import set_duration
from replayer.results.verdict import MET, MISSED, NOT_JUDGED, UNKNOWN


def test_parse_goodput_takes_vllm_bench_serve_pairs():
    assert verdict.parse_goodput(["e2el:30000", "ttft:2000", "tpot:50"]) == {
        "ttft": 2000.0,
        "tpot": 50.0,
        "e2el": 30000.0,
    }
    assert verdict.parse_goodput("tpot:12.5 ttft:0") == {"ttft": 0.0, "tpot": 12.5}
    assert verdict.parse_goodput(None) == {}
    for bad, says in (
        ("ttft=2000", "KEY:VALUE"),
        ("itl:5", "unknown key 'itl'"),
        ("ttft:fast", "not a number"),
        ("ttft:-1", ">= 0"),
        ("ttft:nan", ">= 0"),
        ("traces/x.parquet", "is not KEY:VALUE"),
    ):
        with pytest.raises(ValueError, match=says):
            verdict.parse_goodput([bad])
    with pytest.raises(ValueError, match="twice"):
        verdict.parse_goodput(["ttft:1", "ttft:2"])


def test_goodput_setting_from_flags_and_config_file(tmp_path):
    from replayer.cli import build_parser, read_config_file

    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    args = build_parser().parse_args(["run", str(trace), "--goodput", "ttft:2000", "tpot:50", "e2el:30000"])
    assert args.goodput == ["ttft:2000", "tpot:50", "e2el:30000"]
    cfg = load_config({"trace": str(trace), "goodput": args.goodput})
    assert cfg.goodput_slos == {"ttft": 2000.0, "tpot": 50.0, "e2el": 30000.0}
    conf = tmp_path / "c.yaml"
    conf.write_text("goodput: ttft:2000 e2el:30000\n")  # a config file: one string (or a list) of pairs
    cfg = load_config({"trace": str(trace), **read_config_file(str(conf))})
    assert cfg.goodput_slos == {"ttft": 2000.0, "e2el": 30000.0}
    assert load_config({"trace": str(trace)}).goodput_slos == {}
    with pytest.raises(ConfigError, match=r"goodput \(--goodput\): .*unknown key 'itl'"):
        load_config({"trace": str(trace), "goodput": ["itl:5"]})


@pytest.mark.parametrize(
    "argv",
    [
        ["--goodput", "ttft:2000", "tpot:50", "TRACE"],  # vllm bench serve's form, the trace after it
        ["--goodput", "ttft:2000,tpot:50", "TRACE"],
        ["--goodput", "ttft:2000", "--goodput", "tpot:50", "TRACE"],
        ["--goodput=ttft:2000", "tpot:50", "--max-requests", "5", "TRACE"],
        ["TRACE", "--goodput", "ttft:2000", "tpot:50", "--"],  # (a trailing '--' was "unrecognized")
        ["--goodput", "ttft:2000", "tpot:50", "--", "TRACE"],
    ],
)
def test_goodput_pairs_end_where_the_trace_begins(tmp_path, argv):
    """``nargs='+'`` took the trace after the pairs as one more pair; the pairs now end at the first
    argument that is not one, and a comma list or a repeated flag gives the same bounds."""
    from replayer.cli import build_parser

    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    args = build_parser().parse_args(["run", *(str(trace) if a == "TRACE" else a for a in argv)])
    assert args.goodput == ["ttft:2000", "tpot:50"] and args.trace == str(trace)


def test_goodput_misuse_names_the_fix(tmp_path, capsys):
    from replayer.cli import build_parser

    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--goodput", str(trace)])
    assert "is not a KEY:VALUE pair; give the pairs as --goodput ttft:2000 tpot:50" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the old advice: flags after '--' were taken for traces (a mix)
        build_parser().parse_args(["run", "--goodput", "ttft:2000", "--", str(trace), "--max-requests", "5"])
    assert "'--max-requests' is read as a trace: everything after '--' is" in capsys.readouterr().err


def test_goodput_config_key_takes_a_mapping(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    conf = tmp_path / "c.yaml"
    conf.write_text("goodput: {ttft: 2000, tpot: 50}\n")
    from replayer.cli import read_config_file

    cfg = load_config({"trace": str(trace), **read_config_file(str(conf))})
    assert cfg.goodput_slos == {"ttft": 2000.0, "tpot": 50.0}
    assert load_config({"trace": str(trace), "goodput": "ttft:2000,e2el:9"}).goodput_slos == {"ttft": 2000, "e2el": 9}
    with pytest.raises(ConfigError, match="unknown key 'itl'"):
        load_config({"trace": str(trace), "goodput": {"itl": 5}})


def test_flags_reproduce_goodput_for_workers(tmp_path):
    from replayer.cli import flags_for

    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    flags = flags_for(load_config({"trace": str(trace), "goodput": ["tpot:50", "ttft:2000"]}), {"trace"})
    i = flags.index("--goodput")
    assert flags[i + 1 : i + 3] == ["ttft:2000", "tpot:50"]


SLOS = {"ttft": 100.0, "tpot": 10.0, "e2el": 1000.0}
# one request per line: outcome, ttft, tpot, e2el, completion tokens -> expected code per bound and all
CASES = [
    (("success", 50, 5, 500, 20), (MET, MET, MET, MET)),
    (("success", 150, 5, 500, 20), (MISSED, MET, MET, MISSED)),
    (("success", 50, 15, 500, 20), (MET, MISSED, MET, MISSED)),
    (("success", 50, 5, 1500, 20), (MET, MET, MISSED, MISSED)),
    (("success", 100, 10, 1000, 20), (MET, MET, MET, MET)),  # on the bound: met (value <= bound)
    (("success", 50, None, 500, None), (MET, UNKNOWN, MET, UNKNOWN)),  # no usage: TPOT unknown
    (("success", 150, None, 500, None), (MISSED, UNKNOWN, MET, MISSED)),  # a miss outweighs an unknown
    (("success", None, None, None, None), (UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN)),
    (("success", 50, None, 60, 1), (MET, MET, MET, MET)),  # 1 token: no TPOT, met (as vLLM)
    (("failed", 10, 1, 20, 20), (MISSED, MISSED, MISSED, MISSED)),  # a failure never meets an SLO
    (("failed", None, None, None, None), (MISSED, MISSED, MISSED, MISSED)),
    (("cancelled", 10, 1, 20, 20), (NOT_JUDGED,) * 4),
    (("not_started", None, None, None, None), (NOT_JUDGED,) * 4),
]


def test_judge_per_bound_and_all():
    cols = list(zip(*(c for c, _ in CASES)))
    codes = verdict.judge(*cols, SLOS)
    for i, (_, want) in enumerate(CASES):
        got = tuple(int(codes[k][i]) for k in ("ttft", "tpot", "e2el", "all"))
        assert got == want, (i, CASES[i])
    assert verdict.slo_met(codes["all"])[:8] == [True, False, False, False, True, None, False, None]
    only = verdict.judge(*cols, {"e2el": 1000.0})
    assert set(only) == {"e2el", "all"} and list(only["all"]) == list(codes["e2el"])


def test_fold_and_finish_say_attainment_over_judged_requests():
    cols = list(zip(*(c for c, _ in CASES)))
    counts = verdict.fold(verdict.judge(*cols, SLOS), cols[4])
    assert (counts["slo_met"], counts["slo_missed"], counts["slo_unknown"]) == (3, 6, 2)
    assert counts["slo_requests"]["ttft"] == {"met": 6, "missed": 4, "unknown": 1}
    assert counts["goodput_output_tokens"] == 20 + 20 + 1
    s = verdict.finish(counts, SLOS, duration_s=4.0)
    assert s["goodput_slos_ms"] == SLOS
    assert s["request_goodput"] == 3 / 4.0 and s["output_token_goodput"] == 41 / 4.0
    assert s["slo_attainment"] == 3 / 9
    assert s["slo_attainment_ttft"] == 6 / 10 and s["slo_attainment_tpot"] == 5 / 8
    assert verdict.finish(counts, SLOS, 0.0)["request_goodput"] is None
    empty = verdict.fold(verdict.judge([], [], [], [], [], SLOS), [])
    assert verdict.finish(empty, SLOS, 1.0)["slo_attainment"] is None  # nothing judged: n/a, not 0


def _result(i: int, outcome: str, ttft, e2e, tokens=20, **kw) -> RequestResult:
    ok = outcome == "success"
    return RequestResult(
        row=i,
        input_length=10,
        output_length=20,
        due_ns=i * 10**9,
        sent_ns=i * 10**9,
        end_ns=i * 10**9 + 10**9,
        outcome=outcome,
        error_kind="none" if ok else "http_status",
        prompt_tokens=10 if ok else None,
        completion_tokens=tokens if ok else None,
        ttft_ms=ttft,
        e2e_ms=e2e,
        tpot_ms=(e2e - ttft) / (tokens - 1) if ok and tokens else None,
        dispatch_lag_ms=0.0,
        **{"ttft_from_due_ms": ttft, "e2el_from_due_ms": e2e, **kw},  # sent at due: derive's values
    )


def test_summary_has_the_verdict_only_when_bounds_are_set():
    rs = [
        _result(0, "success", 50.0, 240.0),
        _result(1, "success", 500.0, 690.0),
        _result(2, "failed", None, None),
        _result(3, "success", 60.0, 250.0, tokens=None),
    ]
    t = to_table(rs)
    plain = summarize(t)
    assert "slo_attainment" not in plain and "request_goodput" not in plain
    s = summarize(t, {"ttft": 100.0, "tpot": 50.0})
    assert s["goodput_slos_ms"] == {"ttft": 100.0, "tpot": 50.0}
    assert (s["slo_met"], s["slo_missed"], s["slo_unknown"]) == (1, 2, 1)
    assert s["slo_attainment"] == 1 / 3 and s["slo_attainment_ttft"] == 2 / 4
    assert s["request_goodput"] == 1 / s["duration"]
    assert s["output_token_goodput"] == 20 / s["duration"]
    set_duration(s, 2.0)  # a resumed or merged run's duration: rates anew
    assert s["request_goodput"] == 0.5 and s["output_token_goodput"] == 10.0


def test_from_due_adds_the_time_from_due_to_send_and_leaves_a_session_hold_apart():
    # due 0; held 300 ms behind its predecessor (released at 300 ms); sent at 350 ms: 50 ms late;
    # the first token 100 ms after the send. derive() is the one place from-due is computed.
    def first_token_at(sent_ns, wait_ms):
        return derive(
            Timestamps(
                due_ns=0,
                sent_ns=sent_ns,
                first_token_ns=None if sent_ns is None else sent_ns + 100_000_000,
                last_token_ns=None if sent_ns is None else sent_ns + 100_000_000,
                session_wait_ms=wait_ms,
            )
        )

    assert first_token_at(350_000_000, 300.0).ttft_from_due_ms == pytest.approx(150.0)
    assert first_token_at(350_000_000, None).ttft_from_due_ms == pytest.approx(450.0)
    assert first_token_at(None, None).ttft_from_due_ms is None  # unknown stays unknown
    no_token = derive(Timestamps(due_ns=0, sent_ns=350_000_000, session_wait_ms=300.0))
    assert no_token.ttft_from_due_ms is None and no_token.e2el_from_due_ms is None


def test_the_summary_reads_the_recorded_from_due_latency_and_computes_none_of_its_own():
    # one computation (derive, as the request is measured): a recorded value the columns due_ns /
    # sent_ns would not give is what the summary reports, so no second computation exists
    rs = [_result(i, "success", 40.0, 400.0) for i in range(3)]
    for i, r in enumerate(rs):
        r.due_ns, r.sent_ns = 0, 10_000_000  # 10 ms late by the columns
        r.ttft_from_due_ms, r.e2el_from_due_ms = 1000.0 + i, 2000.0 + i  # what derive recorded
    s = summarize(to_table(rs))
    assert s["median_ttft_from_due_ms"] == pytest.approx(1001.0)
    assert s["median_e2el_from_due_ms"] == pytest.approx(2001.0)
    unknown = summarize(to_table([_result(9, "success", 40.0, 400.0, ttft_from_due_ms=None, e2el_from_due_ms=None)]))
    assert unknown["median_ttft_from_due_ms"] is None and unknown["ttft_from_due_ms_count"] == 0


def test_the_per_request_judge_agrees_with_the_columnar_one():
    rng = np.random.default_rng(7)
    outcomes = rng.choice(["success", "success", "success", "failed", "cancelled", "not_started"], 2000)

    def maybe(v):
        return [None if x < 0 else float(x) for x in v]

    ttft, tpot, e2el = (maybe(rng.integers(-20, 200, 2000)) for _ in range(3))
    tokens = [None if x < 0 else int(x) for x in rng.integers(-1, 4, 2000)]
    for slos in (SLOS, {"tpot": 50.0}, {"ttft": 100.0, "e2el": 150.0}):
        cols = verdict.judge(outcomes, ttft, tpot, e2el, tokens, slos)
        for i in range(2000):
            one = verdict.judge_one(outcomes[i], ttft[i], tpot[i], e2el[i], tokens[i], slos)
            assert one == {k: int(v[i]) for k, v in cols.items()}, (i, slos)
    for case, want in CASES:
        assert tuple(verdict.judge_one(*case, SLOS).values()) == want, case


def test_judge_result_sets_slo_met_and_leaves_the_measured_latencies_alone():
    r = _result(0, "success", 40.0, 400.0, session_wait_ms=300.0)
    r.ttft_from_due_ms = 90.0  # derive's, as the client measured it
    codes = verdict.judge_result(r, {"ttft": 100.0, "e2el": 100.0})
    assert codes == {"ttft": MET, "e2el": MISSED, "all": MISSED} and r.slo_met is False
    assert (r.ttft_from_due_ms, r.e2el_from_due_ms) == (90.0, 400.0)
    unsent = RequestResult(row=1)
    assert verdict.judge_result(unsent, {}) is None and unsent.slo_met is None
    assert verdict.judge_result(unsent, SLOS)["all"] == NOT_JUDGED and unsent.slo_met is None


def test_printed_summary_shows_the_verdict_first_when_bounds_are_set():
    from replayer.results.summary import format_summary

    rs = [_result(0, "success", 50.0, 240.0), _result(1, "success", 500.0, 690.0), _result(2, "failed", None, None)]
    lines = format_summary(summarize(to_table(rs), {"ttft": 100.0, "e2el": 1000.0})).splitlines()
    assert lines[1].startswith("---- Verdict")
    assert lines[2].split() == ["SLO", "bounds", "(ms)", "ttft<=100", "e2el<=1000"]
    assert lines[3].startswith("SLO attainment (every bound)") and lines[3].endswith("33.33% (1 met of 3 judged)")
    assert next(x for x in lines if x.strip().startswith("ttft attainment")).endswith("33.33% (1 met of 3 judged)")
    assert next(x for x in lines if x.strip().startswith("e2el attainment")).endswith("66.67% (2 met of 3 judged)")
    assert lines.index(next(x for x in lines if "Scheduled requests" in x)) > 3
    frm = [x for x in lines if x.startswith("  from the due time (ms)")]
    assert len(frm) == 2 and frm[0].endswith("275.00 / 50.00 / 500.00")  # sent at due: = TTFT's (nearest rank)
    plain = format_summary(summarize(to_table(rs))).splitlines()
    assert not any("Verdict" in x or "SLO" in x for x in plain)


def test_a_folded_summary_keeps_the_verdict_exact(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    import replayer.core.stats as stats
    import replayer.results.summary as summary
    from replayer.results import summarize_files

    monkeypatch.setattr(summary, "BATCH_ROWS", 300)  # folded batch by batch, file by file
    monkeypatch.setattr(stats, "EXACT_LIMIT", 1000)  # percentiles from the sketch

    rng = np.random.default_rng(3)
    files, every = [], []
    for k in range(3):
        rs = [
            _result(k * 2000 + i, "success" if rng.random() > 0.1 else "failed", float(rng.uniform(10, 200)), 400.0)
            for i in range(2000)
        ]
        for r in rs:
            if r.outcome != "success":
                r.ttft_ms = r.e2e_ms = r.tpot_ms = None
        every += rs
        pq.write_table(to_table(rs), tmp_path / f"requests-{k:05d}.parquet")
        files.append(str(tmp_path / f"requests-{k:05d}.parquet"))
    slos = {"ttft": 100.0}
    whole = summarize(to_table(every), slos)
    s = summarize_files(files, slos=slos)
    assert "ttft_ms" in s["percentiles_sketched"]
    for key in (
        "slo_met",
        "slo_missed",
        "slo_unknown",
        "slo_requests",
        "goodput_output_tokens",
        "slo_attainment",
        "slo_attainment_ttft",
    ):
        assert s[key] == whole[key], key
    assert s["request_goodput"] == pytest.approx(whole["slo_met"] / s["duration"])
    assert not [k for k in summarize_files(files, slos={}) if "slo" in k or "goodput" in k]
