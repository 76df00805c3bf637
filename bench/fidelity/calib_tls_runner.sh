#!/usr/bin/env bash
# Runner for ../shared/bench/fidelity/harness.py: the lean reference client (calib_client.py, run
# exactly as the harness's runners/calib.sh runs it) over TLS, through the same stunnel terminator
# as tls_runner.sh (tls_common.sh), against https://127.0.0.1:TLS_PORT. The client has no CA
# option: it trusts the throw-away CA through SSL_CERT_FILE (aiohttp's default SSL context loads
# OpenSSL's default verify paths, which that variable names). stunnel's own CPU in OUT/stunnel.json.
set -euo pipefail
SLICE=$1; OUT=$2; PORT=$3; shift 3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${REPLAYER_PYTHON:-$ROOT/.venv/bin/python}  # (for `replayer tls-certs`; the client runs on FIDELITY_PYTHON)
H=$ROOT/../shared/bench/fidelity
. "$ROOT/bench/fidelity/tls_common.sh"
tls_start "$OUT" "$PORT"
SSL_CERT_FILE=$TLS_CA "${FIDELITY_PYTHON:-python3}" "$H/calib_client.py" --url "https://127.0.0.1:$TLS_PORT" \
  --slice-dir "$SLICE" --out "$OUT" --model "${FIDELITY_MODEL:-tiny-llama}" "$@"
tls_stop "$OUT"
