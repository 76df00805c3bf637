"""Several targets (--target repeated): sessions keep the target of their first turn (case B29 of
shared/cases/client-faults-2.md with its values), a target that is down fails only its own
requests, the results' target column, the config list and the per-target metrics."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from conftest import free_port, replay_against
from faultserver import ABORT, DONE, Plan, ThreadedFaultServer, choice, usage_event
from prometheus_client import CollectorRegistry

from replayer.plan import iter_schedule
from replayer.send.routing import TargetRoute, target_index

# case B29: two targets A and B, the target chosen on a session's first turn (round robin)
B29 = [
    {"timestamp": 0, "session_id": "s1", "turn": 1, "input_length": 64, "output_length": 4, "hash_ids": [1]},
    {"timestamp": 1000, "session_id": "s1", "turn": 2, "input_length": 128, "output_length": 4, "hash_ids": [1, 2]},
    {"timestamp": 1200, "session_id": "s2", "turn": 1, "input_length": 64, "output_length": 4, "hash_ids": [3]},
    {"timestamp": 2000, "session_id": "s1", "turn": 3, "input_length": 192, "output_length": 4, "hash_ids": [1, 2, 4]},
    {"timestamp": 2500, "session_id": "s2", "turn": 2, "input_length": 128, "output_length": 4, "hash_ids": [3, 5]},
]


def _answer(after_ms: float, prompt: int) -> Plan:
    return Plan([(after_ms, choice("x", "length")), (after_ms, usage_event(prompt, 4)), (after_ms + 1, DONE)])


def _plan_a(body) -> Plan:
    # A answers s1's first turn (the only 64-token prompt A gets) after 1500 ms, the rest after 100 ms
    n = len(body["prompt"])
    return _answer(1500 if n == 64 else 100, n)


def _plan_b(body) -> Plan:
    return _answer(100, len(body["prompt"]))


def _write(tmp_path, rows, name="trace.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


def _run(cfg_values: dict, registry: CollectorRegistry | None = None) -> dict:
    from replayer.config import load_config
    from replayer.run import run_replay

    cfg = load_config(
        {"admin_port": 0, "quiet": True, "warm_connections": 2, "scrape_target_metrics": False, **cfg_values}
    )
    return asyncio.run(asyncio.wait_for(run_replay(cfg, registry=registry or CollectorRegistry()), 120))


def _completions(srv) -> list:
    return [r for r in srv.server.received if r.path.endswith("/completions")]


def test_b29_sessions_keep_their_first_turns_target(tmp_path, capsys):
    from replayer.record import read_results

    trace = _write(tmp_path, B29)
    registry = CollectorRegistry()
    with ThreadedFaultServer(_plan_a) as a, ThreadedFaultServer(_plan_b) as b:
        summary = _run(
            {
                "trace": trace,
                "time_unit": "ms",
                "block_size": 64,
                "target": [a.url, b.url],
                "results": str(tmp_path / "res"),
            },
            registry,
        )
        got_a = sorted(len(r.json["prompt"]) for r in _completions(a))
        got_b = sorted(len(r.json["prompt"]) for r in _completions(b))
    assert got_a == [64, 128, 192]  # s1's three turns
    assert got_b == [64, 128]  # s2's two turns
    rows = {(r["session_id"], r["turn"]): r for r in read_results(str(tmp_path / "res")).to_pylist()}
    assert {k: r["target"] for k, r in rows.items()} == {
        ("s1", 1): a.url,
        ("s1", 2): a.url,
        ("s1", 3): a.url,
        ("s2", 1): b.url,
        ("s2", 2): b.url,
    }
    assert all(r["outcome"] == "success" for r in rows.values())
    assert summary["target_switches"] == 0
    printed = capsys.readouterr().out
    assert "Targets (switches inside sessions: 0)" in printed and f"{a.url}: 3 requests (3 ok, 0 failed)" in printed
    assert summary["target"] == [a.url, b.url] and summary["target_policy"] == "session-order"
    assert summary["targets"][a.url]["requests"] == 3 and summary["targets"][b.url]["requests"] == 2
    ms = 1_000_000
    # planned send times: 0, 1000, 1200, 2000, 2500 ms
    assert [rows[k]["due_ns"] // ms for k in (("s1", 1), ("s1", 2), ("s2", 1), ("s1", 3), ("s2", 2))] == [
        0,
        1000,
        1200,
        2000,
        2500,
    ]
    t1, t2, t3 = rows[("s1", 1)], rows[("s1", 2)], rows[("s1", 3)]
    # s1 turn 2 waits for turn 1 (answered after 1500 ms): sent when it ends, held ~500 ms,
    # the hold recorded apart from dispatch lag (send - due = session wait + lag)
    assert t2["sent_ns"] >= t1["end_ns"]
    assert t2["session_wait_ms"] >= 500 - 1
    assert abs((t2["sent_ns"] - t2["due_ns"]) / 1e6 - (t2["session_wait_ms"] + t2["dispatch_lag_ms"])) < 0.01
    assert t1["session_wait_ms"] == 0 and rows[("s2", 1)]["session_wait_ms"] == 0
    # turn 3 (due 2000 ms): not held when turn 2 ended before it (at ~1600 ms on a quiet machine)
    assert t3["sent_ns"] >= t2["end_ns"]
    if t2["end_ns"] <= t3["due_ns"]:
        assert t3["session_wait_ms"] == 0
    # the per-target series: a target label, the closed set of the --target URLs
    ok = {
        t: registry.get_sample_value("replayer_target_requests_total", {"target": t, "outcome": "success"})
        for t in (a.url, b.url)
    }
    assert ok == {a.url: 3.0, b.url: 2.0}
    assert registry.get_sample_value("replayer_target_ttft_seconds_count", {"target": a.url}) == 3.0


def test_one_target_has_no_target_column_values_or_series(tmp_path):
    from replayer.record import read_results

    trace = _write(tmp_path, B29[:2])
    registry = CollectorRegistry()
    with ThreadedFaultServer(_plan_b) as b:
        summary = _run(
            {"trace": trace, "time_unit": "ms", "block_size": 64, "target": b.url, "results": str(tmp_path / "res")},
            registry,
        )
    assert summary["target"] == b.url and "targets" not in summary and "target_switches" not in summary
    assert read_results(str(tmp_path / "res")).column("target").to_pylist() == [None, None]
    assert not [m for m in registry.collect() if m.name.startswith("replayer_target_")]


def test_a_target_down_fails_its_own_requests_the_other_goes_on(tmp_path):
    from replayer.record import read_results
    from replayer.run.simproc import spawn_sim, stop_sim

    # 3 sessions of 2 turns and 2 rows without a session: sessions 0 and 2 and row 4 go to
    # target 0 (a server that resets every completion: down), session 1 and row 5 to the simulator
    rows = []
    for k in range(3):
        rows.append(
            {
                "timestamp": 10 * k,
                "session_id": f"c{k}",
                "turn": 0,
                "input_length": 16,
                "output_length": 2,
                "hash_ids": [10 * k],
            }
        )
    for k in range(3):
        rows.append(
            {
                "timestamp": 100 + 10 * k,
                "session_id": f"c{k}",
                "turn": 1,
                "input_length": 32,
                "output_length": 2,
                "hash_ids": [10 * k, 10 * k + 1],
            }
        )
    rows += [
        {"timestamp": 200, "input_length": 16, "output_length": 2, "hash_ids": [90]},  # row 6
        {"timestamp": 210, "input_length": 16, "output_length": 2, "hash_ids": [91]},
    ]  # row 7
    trace = _write(tmp_path, rows)
    proc, sim_url = spawn_sim(["--model", "m"])  # (the fault server lists "m")
    try:
        with ThreadedFaultServer(Plan([(0, ABORT)])) as down:
            summary = _run(
                {
                    "trace": trace,
                    "time_unit": "ms",
                    "block_size": 16,
                    "target": [down.url, sim_url],
                    "results": str(tmp_path / "res"),
                    "read_timeout_s": 20,
                }
            )
    finally:
        stop_sim(proc)
    got = read_results(str(tmp_path / "res")).to_pylist()
    assert len(got) == 8
    by_target: dict[str, list] = {down.url: [], sim_url: []}
    for r in got:
        by_target[r["target"]].append(r)
    assert sorted((r["session_id"], r["turn"]) for r in by_target[down.url] if r["session_id"]) == [
        ("c0", 0),
        ("c0", 1),
        ("c2", 0),
        ("c2", 1),
    ]
    assert sorted(r["row"] for r in by_target[down.url] if not r["session_id"]) == [6]
    for r in by_target[down.url]:  # (issue 47: a turn after its session's failed turn is never sent)
        if r["session_id"] and r["turn"] > 0:
            assert r["outcome"] == "cancelled" and r["error_kind"] == "dependency" and r["sent_ns"] is None
        else:
            assert r["outcome"] == "failed" and r["error_kind"] and r["error"]
    assert all(r["outcome"] == "success" for r in by_target[sim_url]) and len(by_target[sim_url]) == 3
    assert summary["completed"] == 3 and summary["failed"] == 3 and summary["target_switches"] == 0
    assert summary["cancelled"] == 2 and summary["sessions"]["turns_lost"] == 2
    sec = summary["targets"]
    assert sec[down.url]["failed"] == 3 and sec[down.url]["completed"] == 0
    assert sum(sec[down.url]["errors_by_kind"].values()) == 3
    assert sec[sim_url]["completed"] == 3 and sec[sim_url]["median_ttft_ms"] is not None
    assert sec[down.url]["median_ttft_ms"] is None  # unknown, not 0


def test_not_ready_target_is_named_and_nothing_is_sent(tmp_path):
    from replayer.run.readiness import StartupError

    trace = _write(tmp_path, B29)
    dead = f"http://127.0.0.1:{free_port()}"
    with ThreadedFaultServer(_plan_b) as b:
        with pytest.raises(StartupError, match=rf"1 of 2 targets not ready: target {dead} not ready"):
            _run(
                {
                    "trace": trace,
                    "time_unit": "ms",
                    "block_size": 64,
                    "target": [b.url, dead],
                    "ready_timeout_s": 0.5,
                    "results": str(tmp_path / "res"),
                }
            )
        assert _completions(b) == []


def test_target_list_from_flags_and_config(tmp_path):
    from replayer.cli import build_parser, flags_for, read_config_file
    from replayer.config import ConfigError, load_config

    trace = _write(tmp_path, B29)
    args = build_parser().parse_args(
        ["run", trace, "--target", "http://a:1/v1", "--target", "http://b:2", "--target-policy", "session-hash"]
    )
    from replayer.config import RunConfig

    cfg = load_config({k: v for k, v in vars(args).items() if k in RunConfig.model_fields})
    assert cfg.target == ["http://a:1", "http://b:2"] and cfg.target_policy == "session-hash"
    flags = flags_for(cfg, set())
    i = flags.index("--target")
    assert flags[i : i + 4] == ["--target", "http://a:1", "--target", "http://b:2"]  # the flag repeated
    again = build_parser().parse_args(["run", *flags])  # (what --workers and sweep pass on)
    assert again.target == cfg.target and again.trace == trace
    (tmp_path / "c.yaml").write_text("target:\n  - http://a:1\n  - http://b:2/\ntarget_policy: session-order\n")
    cfg = load_config({"trace": trace, **read_config_file(str(tmp_path / "c.yaml"))})
    assert cfg.targets == ["http://a:1", "http://b:2"]
    assert load_config({"trace": trace, "target": "http://a:1"}).target == ["http://a:1"]  # one string: one target
    with pytest.raises(ConfigError, match="given twice"):
        load_config({"trace": trace, "target": ["http://a:1", "http://a:1/v1"]})
    with pytest.raises(ConfigError, match="target_policy"):
        load_config({"trace": trace, "target_policy": "random"})


@pytest.mark.parametrize(
    "policy,n,row,session,number,want",
    [
        ("session-order", 2, 7, None, None, 1),  # no session: by row
        ("session-order", 3, 7, None, None, 1),
        ("session-order", 2, 0, "s1", 0, 0),  # B29: s1 is session 0 -> A
        ("session-order", 2, 2, "s2", 1, 1),  # s2 is session 1 -> B
        ("session-order", 2, 3, "s1", 0, 0),  # later turns: the session's number, not the row
        ("session-order", 3, 9, "x", 5, 2),
        ("session-order", 1, 9, "x", 5, 0),
    ],
)
def test_target_index_table(policy, n, row, session, number, want):
    assert target_index(policy, n, row, session, number) == want


def test_session_hash_is_stable_and_ignores_the_row():
    got = {target_index("session-hash", 4, row, "agent-42") for row in range(20)}
    assert len(got) == 1
    spread = [target_index("session-hash", 4, 0, f"s{k}") for k in range(400)]
    assert all(60 < spread.count(t) < 140 for t in range(4))  # even-ish over sessions
    with pytest.raises(ValueError):
        target_index("session-order", 2, 0, "s1")  # needs the session's number
    with pytest.raises(ValueError):
        target_index("random", 2, 0)


class _Batch:
    """The columns of a trace batch the schedule and the route read."""

    def __init__(self, ts: np.ndarray, sessions: list, row_offset: int) -> None:
        self.timestamp_ns, self.session_id, self.row_offset = ts, sessions, row_offset

    def __len__(self) -> int:
        return int(self.timestamp_ns.size)


def _batches(rows: list[dict], size: int):
    ts = np.array([r["t"] for r in rows], dtype=np.int64)
    sess = [r.get("s") for r in rows]
    n = len(rows)

    def open_batches():
        for lo in range(0, n, size):
            yield _Batch(ts[lo : lo + size], sess[lo : lo + size], lo)

    return open_batches


def test_route_is_the_same_in_every_shard_and_on_resume():
    rng = np.random.default_rng(3)
    rows = [{"t": k, "s": (f"s{rng.integers(0, 9)}" if k % 3 else None)} for k in range(60)]
    ob = _batches(rows, 7)

    def targets(**kw) -> dict[int, int]:
        out = {}
        for sb in iter_schedule(ob, route=TargetRoute("session-order", 3), **kw):
            out.update(zip(sb.rows.tolist(), sb.targets.tolist()))
        return out

    whole = targets()
    assert len(whole) == 60
    shards = {}
    for i in range(3):
        shards.update(targets(shard=i, shards=3))
    assert shards == whole
    assert targets(skip_rows=30) == {r: t for r, t in whole.items() if r >= 30}
    # sessions: by first appearance, round robin; every turn of a session on one target
    first: dict[str, int] = {}
    for k, r in enumerate(rows):
        if r["s"] is None:
            assert whole[k] == k % 3
        else:
            first.setdefault(r["s"], len(first))
            assert whole[k] == first[r["s"]] % 3


def test_workers_keep_each_session_on_its_target(tmp_path):
    """--workers 2 splits the sessions between two processes; the numbering is over the whole
    trace, so each session still goes where one process would send it (B29's assignment)."""
    from replayer.record import read_results

    # B29 and six more sessions, two turns each, so both workers hold sessions
    rows = list(B29)
    for k in range(6):
        rows.append(
            {
                "timestamp": 3000 + 10 * k,
                "session_id": f"x{k}",
                "turn": 1,
                "input_length": 64,
                "output_length": 4,
                "hash_ids": [100 + k],
            }
        )
        rows.append(
            {
                "timestamp": 3500 + 10 * k,
                "session_id": f"x{k}",
                "turn": 2,
                "input_length": 128,
                "output_length": 4,
                "hash_ids": [100 + k, 200 + k],
            }
        )
    trace = _write(tmp_path, rows)
    results = tmp_path / "res"
    with ThreadedFaultServer(_plan_b) as a, ThreadedFaultServer(_plan_b) as b:
        out = replay_against(
            trace, a.url, results, "--target", b.url, "--time-unit", "ms", "--block-size", "64", "--workers", "2",
            "--warm-connections", "2", model=None,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads((results / "summary.json").read_text())
    assert s["completed"] == len(rows) and s["target_switches"] == 0
    assert "Targets (switches inside sessions: 0)" in out.stdout  # the merged summary, printed
    got = {}
    for i in range(2):
        for r in read_results(str(results / f"worker-{i}")).to_pylist():
            got[(r["session_id"], r["turn"])] = (i, r["target"])
    assert len({w for w, _ in got.values()}) == 2  # both workers sent sessions
    # sessions by first appearance: s1, s2, x0..x5 -> A, B, A, B, ...
    order = ["s1", "s2"] + [f"x{k}" for k in range(6)]
    want = {sid: (a.url, b.url)[n % 2] for n, sid in enumerate(order)}
    assert {k: t for k, (_, t) in got.items()} == {(r["session_id"], r["turn"]): want[r["session_id"]] for r in rows}
    assert s["targets"][a.url]["requests"] + s["targets"][b.url]["requests"] == len(rows)


def test_each_targets_metrics_scraped_and_labelled(tmp_path):
    """Two embedded simulators: each one's /metrics is scraped, its samples carry its URL as the
    label replayer_target, and its prefix-cache and token deltas are in its own section."""
    from replayer.observe import read_samples
    from replayer.run.simproc import spawn_sim, stop_sim

    trace = _write(tmp_path, B29)
    procs = [spawn_sim(), spawn_sim()]
    urls = [u for _, u in procs]
    try:
        summary = _run(
            {
                "trace": trace,
                "time_unit": "ms",
                "block_size": 64,
                "target": urls,
                "speedup": 4,
                "scrape_target_metrics": True,
                "scrape_interval_s": 0.5,
                "results": str(tmp_path / "res"),
            }
        )
    finally:
        for p, _ in procs:
            stop_sim(p)
    assert summary["completed"] == 5 and summary["target_switches"] == 0
    samples = read_samples(str(tmp_path / "res"))
    labelled = {json.loads(x).get("replayer_target") for x in samples.column("labels").to_pylist()}
    assert labelled == set(urls)
    sent = {urls[0]: 64 + 128 + 192, urls[1]: 64 + 128}  # s1's turns on the first, s2's on the second
    for url in urls:
        tm = summary["targets"][url]["target_metrics"]
        assert tm["scrapes"] > 0
        assert tm["latest"]["prompt_tokens"] == sent[url]  # (a fresh simulator: its counter is all ours)
        assert 0 <= tm["deltas"]["prompt_tokens"] <= sent[url]  # (from the first scrape, which may come late)
    hits = [summary["targets"][u]["target_metrics"]["deltas"].get("prefix_cache_hits") for u in urls]
    assert summary["server_prefix_cache_hit_tokens"] == sum(hits)


def test_route_takes_non_text_session_ids_as_their_text():
    route = TargetRoute("session-order", 2)
    got = route.apply(_Batch(np.zeros(5, np.int64), [7, None, 8, 7, "8"], 0), np.arange(5))
    assert got.tolist() == [0, 1, 1, 0, 1]  # 7 -> session 0, 8 and "8" -> session 1; the row without one by row
    assert target_index("session-hash", 5, 0, 8) == target_index("session-hash", 5, 3, "8")


def test_target_switches_count_turns_that_moved():
    import pyarrow as pa

    from replayer.results.targets import target_sections, target_switches

    t = pa.table(
        {
            "session_id": ["s", "s", "s", "u", "u", None, None, "s"],
            "loop": [0, 0, 0, 0, 0, 0, 0, 1],
            "row": [0, 2, 5, 1, 3, 4, 6, 0],
            "target": ["A", "B", "A", "B", "B", "A", "B", None],  # (s's loop-1 turn: not sent)
            "outcome": ["success", "success", "failed", "success", "success", "success", "success", "not_started"],
            "error_kind": [None, None, "connect", None, None, None, None, None],
            "prompt_tokens": [10, 10, None, 10, 10, 10, 10, None],
            "completion_tokens": [1, 1, None, 1, 1, 1, 1, None],
            "ttft_ms": [5.0, 7.0, None, 9.0, 11.0, 13.0, 15.0, None],
            "e2e_ms": [6.0, 8.0, None, 10.0, 12.0, 14.0, 16.0, None],
            "dispatch_lag_ms": [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, None],
        }
    )
    assert target_switches(t) == 2  # s: A -> B -> A; u stays on B; rows without a session do not count
    sec = target_sections(t)
    assert sorted(sec) == ["A", "B"]
    assert sec["A"]["requests"] == 3 and sec["A"]["completed"] == 2 and sec["A"]["failed"] == 1
    # the top level's names (it said `success` where the top level says `completed`)
    assert {"completed", "failed", "cancelled", "not_started"} <= set(sec["A"]) and "success" not in sec["A"]
    assert sec["A"]["errors_by_kind"] == {"connect": 1}
    assert sec["A"]["median_ttft_ms"] == 5.0 and sec["A"]["p99_ttft_ms"] == 13.0  # successful requests only
    assert sec["B"]["total_input_tokens"] == 40 and sec["B"]["errors_by_kind"] == {}
