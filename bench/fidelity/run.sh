#!/usr/bin/env bash
# Measure replayer with the neutral fidelity harness in ../shared/bench/fidelity (issue 7's workload).
#   bench/fidelity/run.sh [W1|stress SPEEDUP] [WORK_DIR]
# W1 = first 600 s of the Mooncake conversation trace at 10x (1,750 rows);
# stress = the same slice with outputs capped at 32 tokens at SPEEDUP.
# REPLAYER_ARGS="--no-launcher ..." passes options to `replayer run`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
H=$ROOT/../shared/bench/fidelity
MODE=${1:-W1}
V=$ROOT/.venv-fidelity
[[ -x $V/bin/python ]] || { python3 -m venv "$V"; "$V/bin/pip" install -q -r "$H/requirements.txt"; }
P=$V/bin/python
if [[ $MODE == stress ]]; then S=${2:?speedup}; W=${3:-$(mktemp -d)}; CAP="--output-cap 32"; NAME=stress_s$S
else S=10; W=${2:-$(mktemp -d)}; CAP=""; NAME=w1; fi
rm -rf "$W/run_$NAME"  # a fresh run folder: replayer keeps (and summarizes) results already in one
$P "$H/trace_slice.py" --first-seconds 600 --speedup "$S" $CAP --out-dir "$W/slice_$NAME" >/dev/null
$P "$H/harness.py" --runner "$ROOT/bench/fidelity/replayer_runner.sh" --slice "$W/slice_$NAME" \
  --out "$W/run_$NAME" --work-dir "$W" --name replayer ${REPLAYER_ARGS:+"--tool-args=$REPLAYER_ARGS"}
echo "score: $W/run_$NAME/score.json"
