#!/usr/bin/env bash
# Measure replayer (or the lean reference client) with the neutral fidelity harness in
# ../shared/bench/fidelity (issue 7's and issue 17's workloads).
#   bench/fidelity/run.sh [W1 | W1chat | W1mm | stress SPEEDUP | tiny RATE] [WORK_DIR]
# W1     = first 600 s of the Mooncake conversation trace at 10x (1,750 rows);
# W1chat = the same rows as chat text (word-level tokenizer, /v1/chat/completions);
# W1mm   = W1chat plus a seeded synthetic image column (bench/fidelity/add_images.py);
#          SPEEDUP=S runs these three at another speed-up than 10;
# PORT=P serves the harness on port P (default 9100; another run on the host may hold it).
# stress = the same slice with outputs capped at 32 tokens at SPEEDUP;
# tiny   = 1,000 requests of 16 prompt tokens and 1 output token, evenly spaced at RATE requests/s,
#          against the harness server with no TTFT or ITL delay (issue 17's tiny requests).
# TOOL=calib runs the reference client (calib_client.py) on the same slice instead of replayer;
# TOOL=record runs replayer through `replayer record` (record_runner.sh: the proxy's CPU and RSS in
# RUN/tool/proxy.json; bench/bench_capture.py interleaves it with direct runs); TOOL=vllm-bench runs
# `vllm bench serve --dataset-name timed_trace` (vllm_bench_runner.sh; needs vLLM installed).
# TOOL=tls runs replayer over TLS through a stunnel terminator in front of the server (tls_runner.sh;
# stunnel's own CPU in RUN/tool/stunnel.json); TOOL=calib-tls runs the reference client over the same
# TLS (calib_tls_runner.sh: the same stunnel start and stop, tls_common.sh), to compare the two there.
# REPLAYER_ARGS="--no-launcher ..." passes options to `replayer run`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
H=$ROOT/../shared/bench/fidelity
MODE=${1:-W1}
V=$ROOT/.venv-fidelity
[[ -x $V/bin/python ]] || { python3 -m venv "$V"; "$V/bin/pip" install -q -r "$H/requirements.txt"; }
P=$V/bin/python
SERVER_ARGS=""
case $MODE in
  stress) S=${2:?speedup}; W=${3:-$(mktemp -d)}; SLICE_ARGS=(--first-seconds 600 --speedup "$S" --output-cap 32); NAME=stress_s$S ;;
  tiny)
    R=${2:?rate (requests/s)}; W=${3:-$(mktemp -d)}; NAME=tiny_r$R; SERVER_ARGS="--base-ms 0 --itl-ms 0"
    mkdir -p "$W"
    "$P" - "$W/tiny_r$R.jsonl" "$R" <<'PYEOF'
import json, sys
path, rate = sys.argv[1], float(sys.argv[2])
with open(path, "w") as f:
    for i in range(1000):
        f.write(json.dumps({"timestamp": round(i * 1000.0 / rate, 6), "input_length": 16,
                            "output_length": 1, "hash_ids": [i]}) + "\n")
PYEOF
    SLICE_ARGS=(--trace "$W/tiny_r$R.jsonl" --first-n 1000 --speedup 1) ;;
  W1mm|W1chat) S=${SPEEDUP:-10}; W=${2:-$(mktemp -d)}; SLICE_ARGS=(--first-seconds 600 --speedup "$S")
    NAME=$(echo "$MODE" | tr A-Z a-z)_s$S ;;
  *) S=${SPEEDUP:-10}; W=${2:-$(mktemp -d)}; SLICE_ARGS=(--first-seconds 600 --speedup "$S")
    NAME=w1; [[ $S == 10 ]] || NAME=w1_s$S ;;
esac
TOOL=${TOOL:-replayer}
rm -rf "$W/run_${NAME}_$TOOL"  # a fresh run folder: replayer keeps (and summarizes) results already in one
$P "$H/trace_slice.py" "${SLICE_ARGS[@]}" --out-dir "$W/slice_$NAME" >/dev/null
if [[ $MODE == W1mm || $MODE == W1chat ]]; then  # the W1 timing as chat text (W1chat), with images (W1mm)
  "$ROOT/.venv/bin/python" "$ROOT/bench/fidelity/add_images.py" "$W/slice_$NAME" $([[ $MODE == W1chat ]] && echo --no-images)
  REPLAYER_ARGS="--endpoint /v1/chat/completions --prompt-mode text --tokenizer $W/slice_$NAME/tokenizer.json ${REPLAYER_ARGS:-}"
fi
if [[ $TOOL == calib ]]; then RUNNER=(--tool calib)
elif [[ $TOOL == record ]]; then RUNNER=(--runner "$ROOT/bench/fidelity/record_runner.sh")
elif [[ $TOOL == vllm-bench ]]; then RUNNER=(--runner "$ROOT/bench/fidelity/vllm_bench_runner.sh")
elif [[ $TOOL == tls ]]; then RUNNER=(--runner "$ROOT/bench/fidelity/tls_runner.sh")
elif [[ $TOOL == calib-tls ]]; then RUNNER=(--runner "$ROOT/bench/fidelity/calib_tls_runner.sh")
else RUNNER=(--runner "$ROOT/bench/fidelity/replayer_runner.sh"); fi
if [[ $TOOL == tls || $TOOL == calib-tls ]]; then  # the certificates written once, outside the measured runner
  export TLS_CERTS=$W/tls-certs
  [[ -f $TLS_CERTS/ca.pem ]] || "$ROOT/.venv/bin/python" -m replayer tls-certs "$TLS_CERTS" > /dev/null
fi
$P "$H/harness.py" "${RUNNER[@]}" ${PORT:+--port "$PORT"} --slice "$W/slice_$NAME" --out "$W/run_${NAME}_$TOOL" --work-dir "$W" --name "$TOOL" \
  ${SERVER_ARGS:+"--server-args=$SERVER_ARGS"} ${REPLAYER_ARGS:+"--tool-args=$REPLAYER_ARGS"}
echo "score: $W/run_${NAME}_$TOOL/score.json"
