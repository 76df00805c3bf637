#!/usr/bin/env bash
# Runner for ../shared/bench/fidelity/harness.py that puts `replayer record` between replayer and
# the harness's server: starts the proxy (capture into OUT/capture), replays the slice through it
# with replayer_runner.sh, stops the proxy (SIGTERM: drain, last rows written) and writes
# OUT/proxy.json: the proxy's CPU seconds (user + system, from /proc), the seconds its main thread was
# runnable but waited for a CPU (/proc/PID/schedstat), peak RSS, rows captured, and
# OUT/proxy_metrics.txt: its /metrics at the end of the replay (the forward delays it measured).
# RECORD_ARGS="--poll-interval 0 ..." passes options to `replayer record`; RECORD_CPUS=LIST runs the
# proxy on those CPUs only (taskset), e.g. a core of its own as a sidecar gets; RECORD_NICE=N runs it
# at that niceness (negative: ahead of the client and the server, where the OS permits it).
set -euo pipefail
SLICE=$1; OUT=$2; PORT=$3; shift 3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${REPLAYER_PYTHON:-$ROOT/.venv/bin/python}
PIN=(); [[ -n ${RECORD_CPUS:-} ]] && PIN=(taskset -c "$RECORD_CPUS")
[[ -n ${RECORD_NICE:-} ]] && PIN=(nice -n "$RECORD_NICE" "${PIN[@]}")
"${PIN[@]}" "$PY" -m replayer record --upstream "http://127.0.0.1:$PORT" --listen 127.0.0.1:0 --admin-port 0 \
  --out "$OUT/capture" ${RECORD_ARGS:-} 2> "$OUT/record.stderr" &
REC=$!
for _ in $(seq 600); do [[ -f $OUT/capture/capture.json ]] && break; sleep 0.1; done
PPORT=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['listen'].rsplit(':', 1)[1])" "$OUT/capture/capture.json")
read -r U0 S0 < <(awk '{print $14, $15}' /proc/$REC/stat)
read -r _ W0 _ < /proc/$REC/schedstat  # ns on a CPU, ns runnable but waiting for one, timeslices
bash "$ROOT/bench/fidelity/replayer_runner.sh" "$SLICE" "$OUT" "$PPORT" "$@"
read -r U1 S1 < <(awk '{print $14, $15}' /proc/$REC/stat)
read -r _ W1 _ < /proc/$REC/schedstat
APORT=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['admin_port'])" "$OUT/capture/capture.json")
"$PY" -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())" \
  "http://127.0.0.1:$APORT/metrics" > "$OUT/proxy_metrics.txt" || echo "record_runner: could not read the proxy's /metrics" >&2
HWM=$(awk '/VmHWM/ {print $2}' /proc/$REC/status)
RSS=$(awk '/VmRSS/ {print $2}' /proc/$REC/status)
kill -TERM $REC; wait $REC
TCK=$(getconf CLK_TCK)
"$PY" -S - "$OUT" "$(( U1 - U0 ))" "$(( S1 - S0 ))" "$TCK" "$HWM" "$RSS" "$(( W1 - W0 ))" <<'PYEOF'
import json, sys
out, user, system, tck, hwm, rss, wait_ns = sys.argv[1], *map(int, sys.argv[2:])
ticks = user + system
err = open(f"{out}/record.stderr").read()
rows = int(err.rsplit(" rows in ", 1)[0].rsplit(" ", 1)[1]) if " rows in " in err else None
json.dump({"proxy_cpu_s": ticks / tck, "proxy_user_s": user / tck, "proxy_system_s": system / tck, "proxy_peak_rss_mb": hwm / 1024, "proxy_end_rss_mb": rss / 1024,
           "proxy_cpu_wait_s": wait_ns / 1e9,
           "rows_captured": rows}, open(f"{out}/proxy.json", "w"))
PYEOF
