#!/usr/bin/env bash
# Runner for ../shared/bench/fidelity/harness.py (contract: RUNNER SLICE_DIR OUT_DIR PORT [args]).
# Replays the slice's JSONL as a generic JSONL trace (its timestamps are fractional ms, already
# compressed by the slice's speed-up: read exactly, no rounding) with `replayer run` against the
# harness's mock server (or REPLAYER_TARGET: tls_runner.sh's TLS terminator in front of it), then
# writes fidelity_report.json from our summary.
set -euo pipefail
SLICE=$1; OUT=$2; PORT=$3; shift 3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${REPLAYER_PYTHON:-$ROOT/.venv/bin/python}
"$PY" -m replayer run "$SLICE/slice.mooncake.jsonl" --format jsonl --time-unit ms \
  --target "${REPLAYER_TARGET:-http://127.0.0.1:$PORT}" --model "${FIDELITY_MODEL:-tiny-llama}" \
  --results "$OUT/results" --admin-port 0 --quiet --log-level warning "$@"
"$PY" -S - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
s = json.load(open(f"{out}/results/summary.json"))
json.dump({"ttft_mean": s["mean_ttft_ms"], "ttft_p50": s["median_ttft_ms"], "ttft_p99": s["p99_ttft_ms"],
           "itl_mean": s["mean_itl_ms"], "tpot_mean": s["mean_tpot_ms"]}, open(f"{out}/fidelity_report.json", "w"))
print(json.dumps({k: s[k] for k in ("completed", "failed", "dispatch_lag_p50_ms", "dispatch_lag_p99_ms",
                                    "dispatch_lag_max_ms", "prompt_token_mismatches")}))
PYEOF
