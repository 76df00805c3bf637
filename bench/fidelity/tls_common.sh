# Sourced by the TLS runners (tls_runner.sh: replayer; calib_tls_runner.sh: the reference client):
# the stunnel terminator in front of the harness's server, started and stopped the same way for
# every client measured over TLS.
#   tls_start OUT PORT  uses the throw-away CA and server certificate in $TLS_CERTS (run.sh writes
#                       them once, before the harness measures anything), else writes them
#                       (`replayer tls-certs`) in OUT/certs; starts stunnel (from Debian: apt-get install stunnel4) on a free
#                       port outside the runner's process tree (so the harness's CPU and RSS sampling
#                       counts the client alone), waits for it to listen; sets TLS_PORT and TLS_CA
#                       (the CA to trust) and stops stunnel when the runner exits.
#   tls_stop OUT        writes OUT/stunnel.json: the terminator's own CPU seconds (user + system,
#                       from /proc) since tls_start.
# Needs PY: a Python with replayer installed.

tls_start() {
  local out=$1 port=$2 stunnel
  stunnel=$(command -v stunnel4 || command -v stunnel) || { echo "$(basename "$0"): needs stunnel (apt-get install stunnel4)" >&2; exit 1; }
  local certs=${TLS_CERTS:-$out/certs}
  [[ -f $certs/ca.pem ]] || "$PY" -m replayer tls-certs "$certs" > /dev/null
  TLS_CA=$certs/ca.pem
  TLS_PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  cat > "$out/stunnel.conf" <<CONF
foreground = yes
pid =
socket = l:TCP_NODELAY=1
socket = r:TCP_NODELAY=1
[harness]
accept = 127.0.0.1:$TLS_PORT
connect = 127.0.0.1:$port
cert = $certs/server.pem
key = $certs/server.key
CONF
  ( "$stunnel" "$out/stunnel.conf" 2> "$out/stunnel.log" & echo $! > "$out/stunnel.pid" )
  _TLS_PID=$(cat "$out/stunnel.pid")
  trap 'kill "$_TLS_PID" 2>/dev/null || true' EXIT
  for _ in $(seq 100); do  # (bash's /dev/tcp: no interpreter started per try, in the measured tree)
    (exec 3<> "/dev/tcp/127.0.0.1/$TLS_PORT") 2>/dev/null && break
    sleep 0.1
  done
  read -r _TLS_U0 _TLS_S0 < <(awk '{print $14, $15}' "/proc/$_TLS_PID/stat")
}

tls_stop() {
  local out=$1 u1 s1
  read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$_TLS_PID/stat")
  "$PY" -c "import json, sys; print(json.dumps({'stunnel_cpu_s': int(sys.argv[1]) / int(sys.argv[2])}))" \
    "$(( u1 + s1 - _TLS_U0 - _TLS_S0 ))" "$(getconf CLK_TCK)" > "$out/stunnel.json"
}
