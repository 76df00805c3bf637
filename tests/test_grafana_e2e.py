"""Issue 46's proof: a real Prometheus (Debian's, 1 s scrapes) watches two replays at once, each
with its own run id and its own simulator, for about 30 s each. With the dashboard's variables set
to one run, every panel query returns that run's series only; Prometheus's p99 of TTFT, ITL, TPOT
and E2E over the run is within 3 % of the summary's; the success total Prometheus scraped after
the run equals the summary's (the linger served the last scrape); the annotation query returns
every event the summary lists, at its time."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from conftest import ROOT, free_port, wait_http

sys.path.insert(0, str(ROOT / "deploy" / "grafana"))
import dashboard  # noqa: E402

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="needs the `prometheus` binary (apt-get install prometheus)"),
]
RUNS = ("run-a", "run-b")


def _get(base: str, path: str, **params) -> dict:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as r:
        out = json.loads(r.read())
    assert out["status"] == "success", out
    return out["data"]


def _start(cmd: list[str], log) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)


def _sim(port: int, log) -> subprocess.Popen:
    fast = ["--ttft-base-ms", "5", "--prefill-us-per-token", "1", "--itl-base-ms", "1", "--itl-per-running-us", "5"]
    return _start([sys.executable, "-m", "replayer", "sim", "--port", str(port), *fast], log)


def _prometheus(tmp_path, jobs: dict[str, list[str]], log) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cfg = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": j, "static_configs": [{"targets": t}]} for j, t in jobs.items()],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(cfg))
    p = _start(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        log,
    )
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/-/ready", 30)
    return p, base


def _post(admin: str, path: str) -> None:
    urllib.request.urlopen(urllib.request.Request(admin + path, method="POST", data=b""), timeout=5).read()


def test_two_runs_on_one_prometheus_are_told_apart_and_fully_seen(tmp_path, mooncake_slice):
    trace = mooncake_slice(150)  # ~430 rows, 15 s at speedup 10; run-b loops twice, run-a at 5x
    t0 = time.monotonic()
    log = open(tmp_path / "procs.log", "w")
    procs: list[subprocess.Popen] = []
    runs: dict[str, tuple] = {}
    sims = [free_port(), free_port()]
    admins = [free_port(), free_port()]
    try:
        procs += [_sim(p, log) for p in sims]
        prom, base = _prometheus(
            tmp_path,
            {"replayer": [f"127.0.0.1:{a}" for a in admins], "target": [f"127.0.0.1:{s}" for s in sims]},
            log,
        )
        procs.append(prom)
        for s in sims:
            wait_http(f"http://127.0.0.1:{s}/health")
        deadline = time.monotonic() + 30
        while len(_get(base, "/api/v1/query", query='up{job="target"} == 1')["result"]) < 2:
            assert time.monotonic() < deadline, "Prometheus never scraped the simulators"
            time.sleep(0.25)
        for i, (run_id, extra) in enumerate(
            zip(RUNS, (["--speedup", "5"], ["--speedup", "10", "--loop", "2", "--warmup-requests", "5"]))
        ):
            res = tmp_path / run_id
            cmd = [sys.executable, "-m", "replayer", "run", str(trace), "--target", f"http://127.0.0.1:{sims[i]}"]
            cmd += [
                "--run-id",
                run_id,
                "--admin-port",
                str(admins[i]),
                "--results",
                str(res),
                "--quiet",
                "--log-level",
                "info",
                *extra,
            ]
            out = open(tmp_path / f"{run_id}.log", "w")
            runs[run_id] = (subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT), res, admins[i], sims[i])
        # run-a: a pause, a speed-up change and a resume on the timeline
        admin_a = f"http://127.0.0.1:{admins[0]}"
        wait_http(admin_a + "/readyz", 60)
        time.sleep(5)
        _post(admin_a, "/pause")
        time.sleep(1.5)
        _post(admin_a, "/speedup?value=6")
        _post(admin_a, "/resume")
        t_run = time.monotonic()
        for run_id, (p, *_rest) in runs.items():
            assert p.wait(180) == 0, (tmp_path / f"{run_id}.log").read_text()[-3000:]
        print(f"set-up {t_run - t0:.1f} s, runs {time.monotonic() - t_run:.1f} s")
        for run_id, (_p, res, admin, sim) in runs.items():
            _check_run(base, run_id, json.loads((res / "summary.json").read_text()), admin, sim)
        text = (tmp_path / "run-a.log").read_text()
        assert "stays served up to 30 s" in text and "metrics linger over (scraped)" in text
    finally:
        for p in procs + [r[0] for r in runs.values()]:
            if p.poll() is None:
                p.terminate()
                p.wait(10)


def _check_run(base: str, run_id: str, summary: dict, admin: int, sim: int) -> None:
    def value(expr: str) -> float:
        got = _get(base, "/api/v1/query", query=expr)["result"]
        assert len(got) == 1, (expr, got)
        return float(got[0]["value"][1])

    sel = f'run_id="{run_id}"'
    # the last scrape came after the run's end: the success total is the summary's
    # (the metrics count the warm-up requests too; the summary's statistics leave them out)
    warm = summary.get("warmup", {}).get("completed", 0)
    assert (
        value(f'last_over_time(replayer_requests_total{{{sel},outcome="success"}}[5m])') == summary["completed"] + warm
    )
    # the p99 over the whole run from the (cumulative) buckets, against the summary's exact one
    for metric, field in (
        ()
        if warm
        else (
            ("replayer_ttft_seconds", "p99_ttft_ms"),
            ("replayer_itl_seconds", "p99_itl_ms"),
            ("replayer_tpot_seconds", "p99_tpot_ms"),
            ("replayer_e2e_latency_seconds", "p99_e2el_ms"),
        )
    ):
        p99 = value(f"histogram_quantile(0.99, sum by (le) (last_over_time({metric}_bucket{{{sel}}}[5m])))")
        assert p99 * 1e3 == pytest.approx(summary[field], rel=0.03), (run_id, metric)

    # every panel query with the variables set to this run: only this run's (or its target's) series
    # (evaluated at this run's last scrape: its series go stale once the linger ends)
    at = float(
        _get(base, "/api/v1/query", query=f"replayer_requests_sent_total{{{sel}}}[5m]")["result"][0]["values"][-1][0]
    )
    model = json.loads(dashboard.OUT.read_text())
    values = {
        "job": "replayer",
        "instance": f"127.0.0.1:{admin}",
        "run_id": run_id,
        "model": ".*",
        "target": f"127.0.0.1:{sim}",
        "tenant": ".*",
    }
    answered = 0
    for expr in dashboard.expressions(model):
        got = _get(base, "/api/v1/query", query=dashboard.substitute(expr, values), time=repr(at))["result"]
        for series in got:
            labels = series["metric"]
            assert labels.get("run_id", run_id) == run_id, (expr, labels)
            if "run_id" not in labels:
                assert labels.get("instance") == values["target"], (expr, labels)
        answered += bool(got)
    assert answered >= 20, answered

    # the annotations: each event of the summary, at its time
    start, end = summary["events"][0]["time_s"] - 5, summary["events"][-1]["time_s"] + 5
    drawn = set()
    for expr in dashboard.annotation_expressions(model):
        q = dashboard.substitute(expr, values)
        for series in _get(base, "/api/v1/query_range", query=q, start=start, end=end, step=1)["result"]:
            assert series["metric"]["run_id"] == run_id
            drawn |= {(series["metric"]["event"], round(float(v))) for _, v in series["values"]}
    want = {(e["event"], round(e["time_s"] * 1000)) for e in summary["events"]}
    assert want <= drawn, want - drawn
    kinds = {e["event"] for e in summary["events"]}
    assert {"start", "stop"} <= kinds
    assert ({"pause", "speedup", "resume"} if run_id == "run-a" else {"warmup_end", "loop"}) <= kinds
