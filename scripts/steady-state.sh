#!/usr/bin/env bash
# Steady state of `certwatch run` at scale (issue #13): starts kube-sim with ROUTES routes
# (one secret each) at LATENCY, runs the daemon against it until /readyz, then samples
# the daemon's VmRSS and the simulator's request counters every INTERVAL seconds for
# DURATION seconds. Prints one CSV line per sample and a summary: RSS after start and at
# the end, requests at the API server while idle (total, per second, the busiest
# interval: a thundering herd of watch renewals would show there).
#
#   ulimit -n 20000
#   scripts/steady-state.sh target/release/certwatch            # 10,000 routes, 10 minutes
#   ROUTES=2000 DURATION=120 scripts/steady-state.sh target/release/certwatch
set -euo pipefail

CERTWATCH=${1:?usage: $0 path/to/certwatch}
ROUTES=${ROUTES:-10000}
NAMESPACES=${NAMESPACES:-100}
LATENCY=${LATENCY:-1414ms}
DURATION=${DURATION:-600}
INTERVAL=${INTERVAL:-30}

work=$(mktemp -d /tmp/certwatch-steady-XXXXXX)
certs=$(mktemp -d /dev/shm/certwatch-steady-certs-XXXXXX)
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
    --generate "routes=$ROUTES,namespaces=$NAMESPACES" \
    --write-kubeconfig "$work/kubeconfig" >"$work/sim.log" 2>&1 &
sim_pid=$!
sim="https://127.0.0.1:$sim_port"
until [ -s "$work/kubeconfig" ] && curl -sk "$sim/sim/stats" >/dev/null 2>&1; do
    kill -0 "$sim_pid" || { echo "the simulator exited; log: $work/sim.log" >&2; exit 1; }
    sleep 0.5
done

started=$(date +%s.%N)
"$CERTWATCH" run --kubeconfig "$work/kubeconfig" --cert-dir "$certs" \
    --listen "127.0.0.1:$http_port" --progress off >"$work/run.log" 2>&1 &
run_pid=$!
until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http_port/readyz")" = 200 ]; do
    kill -0 "$run_pid" || { echo "certwatch run exited; log: $work/run.log" >&2; exit 1; }
    sleep 0.2
done
ready=$(date +%s.%N)

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$run_pid/status"; }
hwm_kib() { awk '/^VmHWM/ {print $2}' "/proc/$run_pid/status"; }
requests() {
    curl -sk "$sim/sim/stats" | python3 -c 'import json, sys; s = json.load(sys.stdin); print(s["requests_total"], s["open_watches"])'
}

# Let the start-up's last writes settle, then take the post-start figure.
sleep "$INTERVAL"
curl -sk -X POST "$sim/sim/stats/reset" >/dev/null
post_start_rss=$(rss_kib)
printf 'ready after %.2f s; VmHWM %d KiB; post-start VmRSS %d KiB\n' \
    "$(echo "$ready - $started" | bc)" "$(hwm_kib)" "$post_start_rss"
echo "seconds,vmrss_kib,requests_since_reset,requests_in_interval,open_watches"
previous=0
busiest=0
elapsed=0
while [ "$elapsed" -lt "$DURATION" ]; do
    sleep "$INTERVAL"
    elapsed=$((elapsed + INTERVAL))
    read -r total watches < <(requests)
    delta=$((total - previous))
    previous=$total
    [ "$delta" -gt "$busiest" ] && busiest=$delta
    echo "$elapsed,$(rss_kib),$total,$delta,$watches"
done
end_rss=$(rss_kib)
python3 - "$post_start_rss" "$end_rss" "$previous" "$DURATION" "$busiest" "$INTERVAL" <<'EOF'
import sys
post, end, total, duration, busiest, interval = map(int, sys.argv[1:])
print(f"post-start VmRSS {post / 1024:.1f} MiB, after {duration} s idle {end / 1024:.1f} MiB "
      f"({(end - post) * 100 / post:+.1f} %)")
print(f"requests while idle: {total} in {duration} s = {total / duration:.1f}/s; "
      f"busiest {interval} s: {busiest} ({busiest / interval:.1f}/s)")
EOF
