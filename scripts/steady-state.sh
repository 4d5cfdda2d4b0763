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
# The simulator is the lab's: LAB, by default the certwatch-lab beside the certwatch given
# (cargo build --release -p certwatch -p certwatch-lab).
set -euo pipefail

CERTWATCH=${1:?usage: $0 path/to/certwatch}
ROUTES=${ROUTES:-10000}
NAMESPACES=${NAMESPACES:-100}
LATENCY=${LATENCY:-1414ms}
DURATION=${DURATION:-600}
INTERVAL=${INTERVAL:-30}

. "$(dirname "$0")/sim-and-run.sh"
start_sim_and_run "$CERTWATCH"

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
