"""The verdict end to end: whole replays (in-process ``run_replay``) against a scripted server on
127.0.0.1 (tests/faultserver.py) whose streams have known times. SLO verdicts per request, in the
summary and in ``replayer_slo_requests_total``; latency from the due time with a known session
hold-back and a known lag (a retry's backoff). Bounds sit far (>= 250 ms) from every scripted
time, so a loaded machine does not flip a verdict."""

import asyncio
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from faultserver import DONE, Plan, ThreadedFaultServer, choice, usage_event
from prometheus_client import CollectorRegistry

from replayer.config import load_config
from replayer.record import read_results
from replayer.run import run_replay


def stream(times_ms: list[float], usage: bool = True) -> Plan:
    """One token per event at ``times_ms`` (after the request arrived), then usage and [DONE]."""
    items = [(t, choice("x", "length" if i == len(times_ms) - 1 else None)) for i, t in enumerate(times_ms)]
    end = times_ms[-1]
    if usage:
        items.append((end + 1, usage_event(16, len(times_ms))))
    items.append((end + 2, DONE))
    return Plan(items)


FAILED = Plan(status=500, content_type="application/json", body=b'{"error": {"message": "boom"}}')


def write_trace(path, rows: list[dict]) -> str:
    cols = {k: [r.get(k) for r in rows] for k in rows[0]}
    cols["input_length"] = [16] * len(rows)
    cols["hash_ids"] = [[i] for i in range(len(rows))]
    t = pa.table(cols).replace_schema_metadata({"replayer.block_size": "16", "replayer.time_unit": "ms"})
    pq.write_table(t, path)
    return str(path)


def replay(tmp_path, trace: str, url: str, **settings) -> tuple[list[dict], dict, CollectorRegistry]:
    cfg = load_config(
        {
            "trace": trace,
            "target": url,
            "results": str(tmp_path / "res"),
            "admin_port": 0,
            "quiet": True,
            "scrape_target_metrics": False,
            "warm_connections": 4,
            **settings,
        }
    )
    registry = CollectorRegistry()
    summary = asyncio.run(asyncio.wait_for(run_replay(cfg, registry=registry), 120))
    rows = sorted(read_results(str(tmp_path / "res")).to_pylist(), key=lambda r: r["row"])
    assert json.loads((tmp_path / "res" / "summary.json").read_text()).get("slo_attainment") == summary.get(
        "slo_attainment"
    )
    return rows, summary, registry


# bounds: ttft 1000 ms, tpot 400 ms, e2el 4000 ms; the case of a request is its output_length
CASES = {
    101: ("met", stream([0, 50, 100])),  # ttft ~0, tpot ~50, e2e ~100
    102: ("ttft missed", stream([2000, 2050, 2100])),  # ttft ~2000 > 1000
    103: ("tpot missed", stream([0, 1200])),  # tpot ~1200 > 400 (N = 2)
    104: ("e2el missed", stream([100 * i for i in range(51)])),  # e2e ~5000 > 4000, tpot ~100
    105: ("tpot unknown", stream([0], usage=False)),  # no usage, one event: N unknown, no TPOT
    106: ("failed", FAILED),
    107: ("one token", stream([0])),  # N = 1: no TPOT, met (as vLLM)
}
# expected per bound (ttft, tpot, e2el) and slo_met
WANT = {
    101: ("met", "met", "met", True),
    102: ("missed", "met", "met", False),
    103: ("met", "missed", "met", False),
    104: ("met", "met", "missed", False),
    105: ("met", "unknown", "met", None),
    106: ("missed", "missed", "missed", False),
    107: ("met", "met", "met", True),
}


def test_slo_verdicts_on_scripted_streams(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", [{"timestamp": i * 5, "output_length": k} for i, k in enumerate(CASES)])
    with ThreadedFaultServer(lambda body: CASES[body["max_tokens"]][1]) as srv:
        rows, s, registry = replay(tmp_path, trace, srv.url, goodput=["ttft:1000", "tpot:400", "e2el:4000"])
    got = {r["output_length"]: r["slo_met"] for r in rows}
    assert got == {k: w[3] for k, w in WANT.items()}, [(CASES[k][0], v) for k, v in got.items()]
    assert s["goodput_slos_ms"] == {"ttft": 1000.0, "tpot": 400.0, "e2el": 4000.0}
    assert (s["slo_met"], s["slo_missed"], s["slo_unknown"]) == (2, 4, 1)
    assert s["slo_attainment"] == 2 / 6
    for i, name in enumerate(("ttft", "tpot", "e2el")):
        want = {r: sum(w[i] == r for w in WANT.values()) for r in ("met", "missed", "unknown")}
        assert s["slo_requests"][name] == want, name
        assert s[f"slo_attainment_{name}"] == want["met"] / (want["met"] + want["missed"])
        for result, n in want.items():
            assert registry.get_sample_value("replayer_slo_requests_total", {"slo": name, "result": result}) == n
    assert registry.get_sample_value("replayer_slo_requests_total", {"slo": "all", "result": "met"}) == 2
    assert registry.get_sample_value("replayer_slo_requests_total", {"slo": "all", "result": "missed"}) == 4
    assert s["request_goodput"] == pytest.approx(2 / s["duration"])
    assert s["output_token_goodput"] == pytest.approx((3 + 1) / s["duration"])  # 101's 3 and 107's 1 tokens


def test_no_bounds_no_verdict(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", [{"timestamp": 0, "output_length": 101}])
    with ThreadedFaultServer(CASES[101][1]) as srv:
        rows, s, registry = replay(tmp_path, trace, srv.url)
    assert rows[0]["slo_met"] is None and "slo_attainment" not in s and "request_goodput" not in s
    assert registry.get_sample_value("replayer_slo_requests_total", {"slo": "all", "result": "met"}) is None
    assert rows[0]["ttft_from_due_ms"] is not None  # the from-due view needs no bounds


def test_latency_from_due_with_a_known_hold_back_and_a_known_lag(tmp_path):
    # A (session s) streams for ~1200 ms; B, its next turn, is due 100 ms after A: held ~1100 ms.
    # C fails once with 500 and is retried after a 600 ms backoff: 600 ms from its due time to
    # its (last) send that its TTFT from the send does not show.
    rows_in = [
        {"timestamp": 0, "output_length": 201, "session_id": "s"},
        {"timestamp": 100, "output_length": 202, "session_id": "s"},
        {"timestamp": 0, "output_length": 203, "session_id": "c"},
    ]
    tried = []

    def plan(body):
        k = body["max_tokens"]
        if k == 203 and not tried:
            tried.append(1)
            return FAILED
        return {201: stream([0, 600, 1200]), 202: stream([0, 20, 40]), 203: stream([0, 20, 40])}[k]

    trace = write_trace(tmp_path / "t.parquet", sorted(rows_in, key=lambda r: r["timestamp"]))
    with ThreadedFaultServer(plan) as srv:
        rows, s, registry = replay(tmp_path, trace, srv.url, retry_max=1, retry_backoff_s=0.6)
    a, b, c = (next(r for r in rows if r["output_length"] == k) for k in (201, 202, 203))
    assert all(r["outcome"] == "success" for r in (a, b, c))
    # the hold is reported apart: B's from-due latency is its TTFT plus its dispatch lag only
    assert b["session_wait_ms"] > 900
    assert b["ttft_from_due_ms"] - b["ttft_ms"] == pytest.approx(b["dispatch_lag_ms"], abs=1e-3)
    assert b["e2el_from_due_ms"] - b["e2e_ms"] == pytest.approx(b["dispatch_lag_ms"], abs=1e-3)
    assert b["ttft_from_due_ms"] - b["ttft_ms"] < b["session_wait_ms"] / 2
    # A was neither held nor retried: from-due = usual + dispatch lag
    assert a["ttft_from_due_ms"] - a["ttft_ms"] == pytest.approx(a["dispatch_lag_ms"], abs=1e-3)
    # C: the backoff before its last send is in its from-due latency, not in its TTFT
    assert c["retries"] == 1
    assert c["ttft_from_due_ms"] - c["ttft_ms"] >= 590
    assert c["e2el_from_due_ms"] - c["e2e_ms"] >= 590
    assert c["ttft_from_due_ms"] == pytest.approx((c["first_token_ns"] - c["due_ns"]) / 1e6, abs=1e-3)
    # the summary's from-due statistics beside the usual ones, and the live histograms
    assert s["ttft_from_due_ms_count"] == 3
    assert s["max_ttft_from_due_ms"] == pytest.approx(max(r["ttft_from_due_ms"] for r in rows))
    assert s["max_ttft_from_due_ms"] >= 590 > s["max_ttft_ms"]
    assert s["mean_e2el_from_due_ms"] == pytest.approx(sum(r["e2el_from_due_ms"] for r in rows) / 3)
    assert registry.get_sample_value("replayer_ttft_from_due_seconds_count") == 3
    assert registry.get_sample_value("replayer_e2e_latency_from_due_seconds_sum") == pytest.approx(
        sum(r["e2el_from_due_ms"] for r in rows) / 1e3
    )
