#!/usr/bin/env bash
# Requests `certwatch run` makes until /readyz against kube-sim, by verb and resource
# and by response code (issue #13: 2N + 100 on a server without streaming lists).
#
#   scripts/start-requests.sh target/release/certwatch --feature-gates WatchList=false
#   ROUTES=2000 NAMESPACES=50 LATENCY=1414ms scripts/start-requests.sh target/release/certwatch
# Extra arguments go to `certwatch-lab sim` (LAB, by default the certwatch-lab beside the
# certwatch given: cargo build --release -p certwatch -p certwatch-lab).
set -euo pipefail

CERTWATCH=${1:?usage: $0 path/to/certwatch [sim flags...]}
shift
ROUTES=${ROUTES:-2000}
NAMESPACES=${NAMESPACES:-50}
LATENCY=${LATENCY:-1414ms}

. "$(dirname "$0")/sim-and-run.sh"
start_sim_and_run "$CERTWATCH" "$@"
# Requests abandoned by the client still reach the server's counters a moment later.
sleep 3
printf 'ready after %.2f s\n' "$(echo "$ready - $started" | bc)"
curl -sk "$sim/sim/stats" | python3 -c '
import json, sys
stats = json.load(sys.stdin)
print("requests:", stats["requests_total"], json.dumps(stats["requests"], sort_keys=True))
print("responses:", json.dumps(stats["responses"], sort_keys=True))
print("open watches:", stats["open_watches"])'
