"""Opt-in: a real vLLM on CPU (../shared/tools/vllm_cpu_target.sh start; tiny-llama on 127.0.0.1:8000).

Runs when REPLAYER_VLLM=1 (`.ci/run` then installs and starts the server) or when a vLLM already
answers at $REPLAYER_VLLM_URL (default http://127.0.0.1:8000). Skipped otherwise.
"""

import json
import os
import subprocess
import sys
import urllib.request

import pyarrow.parquet as pq
import pytest

from conftest import SHARED

URL = os.environ.get("REPLAYER_VLLM_URL", "http://127.0.0.1:8000")
TOKENIZER = os.environ.get("REPLAYER_VLLM_TOKENIZER",
                           os.path.join(os.environ.get("VLLM_WORKDIR", ".vllm-cpu"), "tiny-llama"))


def _vllm_up() -> bool:
    try:
        with urllib.request.urlopen(URL + "/v1/models", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not (os.environ.get("REPLAYER_VLLM") == "1" or _vllm_up()),
                                 reason="no real vLLM (set REPLAYER_VLLM=1 or start one on 127.0.0.1:8000)")]


def _first_rows(tmp_path, n: int, *, scale: float = 1.0):
    out = tmp_path / "rows.jsonl"
    with open(SHARED / "traces" / "mooncake_conversation.jsonl") as src, open(out, "w") as dst:
        for i, line in enumerate(src):
            if i >= n:
                break
            dst.write(line)
    return out


def test_main_job_command_against_real_vllm(tmp_path):
    """The README's run command with --target: token-exact prompts and outputs on a real engine."""
    trace = _first_rows(tmp_path, 12)
    res = tmp_path / "res"
    args = [sys.executable, "-m", "replayer", "run", str(trace), "--target", URL, "--model", "tiny-llama",
            "--speedup", "10", "--results", str(res), "--admin-port", "0", "--vocab-range", "3:32000"]
    if os.path.isdir(TOKENIZER):
        args += ["--tokenizer", TOKENIZER]
    p = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((res / "summary.json").read_text())
    assert s["completed"] == 12 and s["failed"] == 0
    assert s["prompt_token_mismatches"] == 0 and s["completion_token_mismatches"] == 0
    for r in pq.read_table(res / "requests.parquet").to_pylist():
        assert r["prompt_tokens"] == r["input_length"] and r["completion_tokens"] == r["output_length"]
        assert r["ttft_ms"] > 0 and r["tpot_ms"] > 0
    print(json.dumps({k: s[k] for k in ("duration", "completed", "mean_ttft_ms", "mean_tpot_ms",
                                        "dispatch_lag_p99_ms")}))
