#!/usr/bin/env bash
# Runner for ../shared/bench/fidelity/harness.py that puts a TLS terminator (stunnel, tls_common.sh)
# between replayer and the harness's server and replays the slice with replayer_runner.sh against
# https://127.0.0.1:TLS_PORT with --ca-bundle; stunnel's own CPU in OUT/stunnel.json.
set -euo pipefail
SLICE=$1; OUT=$2; PORT=$3; shift 3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${REPLAYER_PYTHON:-$ROOT/.venv/bin/python}
. "$ROOT/bench/fidelity/tls_common.sh"
tls_start "$OUT" "$PORT"
REPLAYER_TARGET="https://127.0.0.1:$TLS_PORT" bash "$ROOT/bench/fidelity/replayer_runner.sh" "$SLICE" "$OUT" "$PORT" \
  --ca-bundle "$TLS_CA" "$@"
tls_stop "$OUT"
