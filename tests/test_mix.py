"""Mixed traces (tenants) on one clock: hash scope (no false sharing between local-scope traces),
session ids kept apart, and a two-tenant run against the embedded simulator with per-tenant
results, metrics and summary sections."""

from __future__ import annotations

import asyncio
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from replayer.trace import TraceError, mix_traces, parse_entry

DATA = Path(__file__).parent / "data"
WEKA = str(DATA / "weka_sample.jsonl")
MOONCAKE = Path(__file__).parents[1] / "traces" / "mooncake_conversation_10min.parquet"


def _blocks(t, tenant):
    return set(np.concatenate([t.hash_ids(i) for i in range(len(t)) if t.tenant[i] == tenant]).tolist())


def _mix(*specs, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mix_traces([parse_entry(s) for s in specs], **kw)


def test_local_scope_traces_share_no_block_global_scope_shares():
    t = _mix(f"{WEKA},tenant=a", f"{WEKA},tenant=b,offset_s=1")
    assert not _blocks(t, "a") & _blocks(t, "b")
    g = _mix(f"{WEKA},tenant=a,hash_id_scope=global", f"{WEKA},tenant=b,hash_id_scope=global")
    assert _blocks(g, "a") == _blocks(g, "b")  # the same trace twice: declared global, ids kept


def test_mix_times_sessions_and_tenants():
    t = _mix(f"{WEKA},tenant=a", f"{WEKA},tenant=b,offset_s=1,rate=2")
    a = [i for i in range(len(t)) if t.tenant[i] == "a"]
    b = [i for i in range(len(t)) if t.tenant[i] == "b"]
    assert sorted(int(t.timestamp_ns[i]) // 10**6 for i in a) == [0, 0, 1500, 2500, 3200, 3800, 6000]
    assert sorted(int(t.timestamp_ns[i]) // 10**6 for i in b) == [1000, 1000, 1750, 2250, 2600, 2900, 4000]
    assert {t.session_id[i] for i in a} == {"a/trace_0001", "a/trace_0002", "a/trace_0001::sa:a1"}
    assert {t.session_id[i] for i in b} == {"b/trace_0001", "b/trace_0002", "b/trace_0001::sa:a1"}
    assert {t.parent_request_id[i] for i in b} == {
        None,
        "b/trace_0001#0",
        "b/trace_0001#1",
        "b/trace_0002#0",
        "b/trace_0001::sa:a1#0",
    }
    assert list(t.timestamp_ns) == sorted(t.timestamp_ns)


def test_mix_refuses_block_sizes_that_differ_and_same_tenant_twice():
    if not MOONCAKE.exists():
        pytest.skip("trace slice not present")
    with pytest.raises(TraceError, match="block_size: mixed traces need one block size: a 64, b 512"):
        _mix(f"{WEKA},tenant=a", f"{MOONCAKE},tenant=b")
    with pytest.raises(ValueError, match="tenant names must differ"):
        _mix(f"{WEKA},tenant=a", f"{WEKA},tenant=a")


def test_two_tenant_run_against_the_simulator(tmp_path):
    """Two local-scope traces mixed, replayed against the embedded simulator: each tenant has
    its rows, metrics and summary section; the expected prefix-cache hits (the model) and the
    simulator's prefix-cache counter agree, and both count only sharing inside a session."""
    from replayer.config import load_config
    from replayer.record import read_results
    from replayer.run import run_replay

    res = tmp_path / "res"
    cfg = load_config(
        {
            "trace": WEKA,
            "mix": [f"{WEKA},tenant=a", {"trace": WEKA, "tenant": "b", "offset_s": 1}],
            "results": str(res),
            "admin_port": 0,
            "quiet": True,
            "speedup": 4,
            "warm_connections": 4,
            "scrape_interval_s": 0.2,
        }
    )
    registry = CollectorRegistry()
    summary = asyncio.run(asyncio.wait_for(run_replay(cfg, registry=registry), 120))
    rows = read_results(str(res)).to_pylist()
    assert len(rows) == 14 and {r["tenant"] for r in rows} == {"a", "b"}
    assert all(r["session_id"].startswith(r["tenant"] + "/") for r in rows)
    assert all(r["outcome"] == "success" for r in rows)
    # per record: trace_0001 shares 2 then 4 blocks of 64 (384 tokens), its subagent 2 blocks of the
    # record's (128) then 2 blocks and the one full 16-token KV block of its first call's partial
    # third block (144), trace_0002 shares 2 (128): 784 tokens a tenant, none across tenants
    assert summary["expected_prefix_hit_tokens"] == 1568
    assert summary["server_prefix_cache_hit_tokens"] == 1568
    tenants = json.loads((res / "summary.json").read_text())["tenants"]
    assert set(tenants) == {"a", "b"}
    for name in ("a", "b"):
        assert tenants[name]["requests"] == 7 and tenants[name]["completed"] == 7
        assert tenants[name]["expected_prefix_hit_tokens"] == 784
        assert tenants[name]["median_ttft_ms"] is not None
        assert registry.get_sample_value("replayer_tenant_requests_total", {"tenant": name, "outcome": "success"}) == 7


def test_a_resume_with_another_mix_is_refused(tmp_path):
    from replayer.config import load_config
    from replayer.run import run_replay
    from replayer.run.daemon import StartupError

    res = tmp_path / "res"
    base = {
        "results": str(res),
        "admin_port": 0,
        "quiet": True,
        "speedup": 8,
        "warm_connections": 2,
        "scrape_target_metrics": False,
    }
    cfg = load_config({"mix": [f"{WEKA},tenant=a", f"{WEKA},tenant=b"], **base})
    asyncio.run(asyncio.wait_for(run_replay(cfg, registry=CollectorRegistry()), 120))
    again = load_config({"mix": [f"{WEKA},tenant=a", f"{WEKA},tenant=c"], **base, "resume": str(res)})
    with pytest.raises(StartupError, match="--mix .*tenant=b.* there, .*tenant=c.* now"):
        asyncio.run(asyncio.wait_for(run_replay(again, registry=CollectorRegistry()), 120))


def test_shards_of_a_mix_merge_into_per_tenant_sections(tmp_path):
    from replayer.config import load_config
    from replayer.results.merge import merge_results
    from replayer.run import run_replay

    dirs = []
    for shard in ("0/2", "1/2"):
        d = tmp_path / shard.replace("/", "-")
        cfg = load_config(
            {
                "mix": [f"{WEKA},tenant=a", f"{WEKA},tenant=b"],
                "shard": shard,
                "results": str(d),
                "admin_port": 0,
                "quiet": True,
                "speedup": 8,
                "warm_connections": 2,
                "scrape_target_metrics": False,
            }
        )
        asyncio.run(asyncio.wait_for(run_replay(cfg, registry=CollectorRegistry()), 120))
        dirs.append(str(d))
    s = merge_results(dirs, str(tmp_path / "merged"), quiet=True)
    assert {k: v["requests"] for k, v in s["tenants"].items()} == {"a": 7, "b": 7}
    assert s["tenants"]["a"]["completed"] == 7


def test_sessions_stay_gated_when_another_trace_of_the_mix_chains_requests(tmp_path):
    """The Weka sample's subagent gives the mix request/parent ids; the Copilot sample's rows have
    none and still wait for their session's previous call (by session id)."""
    from replayer.config import load_config
    from replayer.record import read_results
    from replayer.run import run_replay

    res = tmp_path / "res"
    cfg = load_config(
        {
            "mix": [WEKA, str(DATA / "copilot_sample.jsonl")],
            "results": str(res),
            "admin_port": 0,
            "quiet": True,
            "speedup": 40,
            "warm_connections": 2,
            "scrape_target_metrics": False,
        }
    )
    asyncio.run(asyncio.wait_for(run_replay(cfg, registry=CollectorRegistry()), 120))
    rows = read_results(str(res), columns=["tenant", "turn", "session_wait_ms", "sent_ns"]).to_pylist()
    later = [r for r in rows if r["tenant"] == "copilot_sample" and r["turn"] > 0]
    assert len(later) == 4 and all(r["session_wait_ms"] is not None for r in later)
