#!/usr/bin/env bash
# Runner for ../shared/bench/fidelity/harness.py that puts a TLS terminator (stunnel, from Debian:
# apt-get install stunnel4) between replayer and the harness's server: writes a throw-away CA and
# server certificate (`replayer tls-certs`), starts stunnel on a free port (outside the runner's
# process tree, so the harness's CPU and RSS sampling counts replayer alone), replays the slice
# with replayer_runner.sh against https://127.0.0.1:TLS_PORT with --ca-bundle, stops stunnel and
# writes OUT/stunnel.json: the terminator's own CPU seconds (user + system, from /proc).
set -euo pipefail
SLICE=$1; OUT=$2; PORT=$3; shift 3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${REPLAYER_PYTHON:-$ROOT/.venv/bin/python}
STUNNEL=$(command -v stunnel4 || command -v stunnel) || { echo "tls_runner: needs stunnel (apt-get install stunnel4)" >&2; exit 1; }
"$PY" -m replayer tls-certs "$OUT/certs" > /dev/null
TLS_PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
cat > "$OUT/stunnel.conf" <<EOF
foreground = yes
pid =
socket = l:TCP_NODELAY=1
socket = r:TCP_NODELAY=1
[harness]
accept = 127.0.0.1:$TLS_PORT
connect = 127.0.0.1:$PORT
cert = $OUT/certs/server.pem
key = $OUT/certs/server.key
EOF
( "$STUNNEL" "$OUT/stunnel.conf" 2> "$OUT/stunnel.log" & echo $! > "$OUT/stunnel.pid" )
ST=$(cat "$OUT/stunnel.pid")
trap 'kill "$ST" 2>/dev/null || true' EXIT
for _ in $(seq 100); do "$PY" -c "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 1).close()" "$TLS_PORT" 2>/dev/null && break; sleep 0.1; done
read -r U0 S0 < <(awk '{print $14, $15}' /proc/$ST/stat)
REPLAYER_TARGET="https://127.0.0.1:$TLS_PORT" bash "$ROOT/bench/fidelity/replayer_runner.sh" "$SLICE" "$OUT" "$PORT" \
  --ca-bundle "$OUT/certs/ca.pem" "$@"
read -r U1 S1 < <(awk '{print $14, $15}' /proc/$ST/stat)
TCK=$(getconf CLK_TCK)
echo "{\"stunnel_cpu_s\": $(( (U1 + S1 - U0 - S0) ))e0, \"clk_tck\": $TCK}" | "$PY" -c "import json, sys; d = json.load(sys.stdin); print(json.dumps({'stunnel_cpu_s': d['stunnel_cpu_s'] / d['clk_tck']}))" > "$OUT/stunnel.json"
