"""End to end: the real Mooncake trace replayed against the simulator, checked on both sides."""

import json
import subprocess
import sys
import threading
import time
import urllib.request

import orjson
import pyarrow.parquet as pq
from conftest import free_port, wait_http
from prometheus_client.parser import text_string_to_metric_families

from replayer.trace import read_trace


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.labels or s.name.endswith("_total"):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_two_minutes_of_mooncake_token_exact(tmp_path, mooncake_slice, sim_process):
    trace_path = mooncake_slice(120)
    trace = read_trace(str(trace_path))
    n = len(trace)
    assert n > 300
    url, received = sim_process("--itl-base-ms", "1")  # (the tokens are checked, not their pace)
    admin_port = free_port()
    results = tmp_path / "res"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace_path),
            "--target",
            url,
            "--speedup",
            "20",
            "--results",
            str(results),
            "--admin-port",
            str(admin_port),
            "--start-delay",
            "1.0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    scrapes = []

    def scrape_loop():
        try:
            wait_http(f"http://127.0.0.1:{admin_port}/healthz", 30)
            while proc.poll() is None:
                try:
                    scrapes.append(_scrape(f"http://127.0.0.1:{admin_port}/metrics"))
                except OSError:
                    pass
                time.sleep(0.5)
        except TimeoutError:
            pass

    th = threading.Thread(target=scrape_loop)
    th.start()
    out, err = proc.communicate(timeout=240)
    th.join()
    assert proc.returncode == 0, err[-3000:]
    assert "Successful requests" in out

    # results: one row per trace row, reopens, every request exact
    table = pq.read_table(results / "requests.parquet")
    assert table.num_rows == n
    rows = table.to_pylist()
    assert sorted(r["row"] for r in rows) == list(range(n))
    for r in rows:
        assert r["outcome"] == "success", r
        assert r["prompt_len_sent"] == r["input_length"] == trace.input_length[r["row"]]
        assert r["prompt_tokens"] == r["input_length"]
        assert r["completion_tokens"] == r["output_length"] == trace.output_length[r["row"]]
        assert r["ttft_ms"] is not None and r["ttft_ms"] > 0
    summary = json.loads((results / "summary.json").read_text())
    assert summary["completed"] == n and summary["failed"] == 0
    # a finished folder: the rolled files, no parts left (nor their folder)
    assert sorted(x.name for x in results.iterdir()) == [
        "checkpoint.json",
        "requests.parquet",
        "summary.json",
        "target_metrics.parquet",
    ]
    assert summary["prompt_token_mismatches"] == 0 and summary["scheduled"] == n

    # what the server received: exact lengths, shared prefixes exactly where hash ids are shared
    got = [orjson.loads(line) for line in received.read_text().splitlines()]
    assert len(got) == n
    for g in got:
        assert isinstance(g["prompt"], list)
        assert len(g["prompt"]) == g["prompt_tokens"]
    # match received requests to rows by (length, max_tokens) in arrival order
    pools: dict[tuple, list[int]] = {}
    for i in range(n):
        pools.setdefault((int(trace.input_length[i]), int(trace.output_length[i])), []).append(i)
    prompt_of = {}
    for g in sorted(got, key=lambda g: g["arrival_ns"]):
        prompt_of[pools[(len(g["prompt"]), g["max_tokens"])].pop(0)] = g["prompt"]
    checked_shared = checked_diff = 0
    for i in range(n):
        hi = trace.hash_ids(i).tolist()
        for j in range(i):
            hj = trace.hash_ids(j).tolist()
            k = 0
            while k < min(len(hi), len(hj)) and hi[k] == hj[k]:
                k += 1
            if k == 0:
                continue
            a, b = prompt_of[i], prompt_of[j]
            assert a[: k * 512] == b[: k * 512]
            checked_shared += 1
            if k < len(hi) and k < len(hj) and min(len(a), len(b)) > k * 512:
                assert a[k * 512 : (k + 1) * 512] != b[k * 512 : (k + 1) * 512]
                checked_diff += 1
            break  # one earlier partner per row keeps this O(n^2) loop short
    assert checked_shared > 50 and checked_diff > 50

    # /metrics served the counters while the replay ran
    live = [s for s in scrapes if s.get("replayer_requests_sent_total", 0) > 0]
    assert live, "no scrape saw requests sent"
    assert any(s.get("replayer_requests_total", 0) > 0 for s in live)
    assert max(s["replayer_prompt_tokens_sent_total"] for s in live) > 0
