#!/usr/bin/env bash
# Requests `certwatch run` makes until /readyz against kube-sim, by verb and resource
# and by response code (issue #13: 2N + 100 on a server without streaming lists).
#
#   scripts/start-requests.sh target/release/certwatch --feature-gates WatchList=false
#   ROUTES=2000 NAMESPACES=50 LATENCY=1414ms scripts/start-requests.sh target/release/certwatch
# Extra arguments go to `certwatch sim`.
set -euo pipefail

CERTWATCH=${1:?usage: $0 path/to/certwatch [sim flags...]}
shift
ROUTES=${ROUTES:-2000}
NAMESPACES=${NAMESPACES:-50}
LATENCY=${LATENCY:-1414ms}

work=$(mktemp -d /tmp/certwatch-start-XXXXXX)
certs=$(mktemp -d /dev/shm/certwatch-start-certs-XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
sim_port=$(free_port)
http_port=$(free_port)
sim_pid=""
run_pid=""
cleanup() {
    [ -n "$run_pid" ] && kill "$run_pid" 2>/dev/null && wait "$run_pid" 2>/dev/null
    [ -n "$sim_pid" ] && kill "$sim_pid" 2>/dev/null && wait "$sim_pid" 2>/dev/null
    rm -rf "$certs"
}
trap cleanup EXIT

"$CERTWATCH" sim --tls --listen "127.0.0.1:$sim_port" --latency "$LATENCY" \
    --generate "routes=$ROUTES,namespaces=$NAMESPACES" "$@" \
    --write-kubeconfig "$work/kubeconfig" >"$work/sim.log" 2>&1 &
sim_pid=$!
sim="https://127.0.0.1:$sim_port"
until [ -s "$work/kubeconfig" ] && curl -sk "$sim/sim/stats" >/dev/null 2>&1; do
    kill -0 "$sim_pid" || { echo "the simulator exited; log: $work/sim.log" >&2; exit 1; }
    sleep 0.5
done
curl -sk -X POST "$sim/sim/stats/reset" >/dev/null

started=$(date +%s.%N)
"$CERTWATCH" run --kubeconfig "$work/kubeconfig" --cert-dir "$certs" \
    --listen "127.0.0.1:$http_port" --progress off >"$work/run.log" 2>&1 &
run_pid=$!
until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http_port/readyz")" = 200 ]; do
    kill -0 "$run_pid" || { echo "certwatch run exited; log: $work/run.log" >&2; exit 1; }
    sleep 0.2
done
ready=$(date +%s.%N)
# Requests abandoned by the client still reach the server's counters a moment later.
sleep 3
printf 'ready after %.2f s\n' "$(echo "$ready - $started" | bc)"
curl -sk "$sim/sim/stats" | python3 -c '
import json, sys
stats = json.load(sys.stdin)
print("requests:", stats["requests_total"], json.dumps(stats["requests"], sort_keys=True))
print("responses:", json.dumps(stats["responses"], sort_keys=True))
print("open watches:", stats["open_watches"])'
