# Sourced by the scripts that measure `certwatch run` against kube-sim: starts the
# simulator with ROUTES routes (one secret each) in NAMESPACES namespaces at LATENCY
# (extra arguments go to `certwatch-lab sim`), then `certwatch run` against it, and waits
# for /readyz. The simulator is the lab's: LAB, by default the certwatch-lab beside the
# certwatch binary given (`cargo build --release -p certwatch -p certwatch-lab`). Sets sim
# (the simulator's URL), run_pid, work, and started/ready (seconds since the epoch); stops
# both processes on exit.

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_sim_and_run CERTWATCH [SIM_ARGS...]
start_sim_and_run() {
    local certwatch=$1
    shift
    local lab=${LAB:-$(dirname "$certwatch")/certwatch-lab}
    [ -x "$lab" ] || { echo "no certwatch-lab at $lab: build it (cargo build --release -p certwatch-lab) or set LAB" >&2; exit 1; }
    work=$(mktemp -d /tmp/certwatch-measure-XXXXXX)
    certs=$(mktemp -d /dev/shm/certwatch-measure-certs-XXXXXX)
    local sim_port http_port
    sim_port=$(free_port)
    http_port=$(free_port)
    sim_pid=""
    run_pid=""
    trap stop_sim_and_run EXIT

    "$lab" sim --tls --listen "127.0.0.1:$sim_port" --latency "$LATENCY" \
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
    "$certwatch" run --kubeconfig "$work/kubeconfig" --cert-dir "$certs" \
        --listen "127.0.0.1:$http_port" --shutdown-delay 0s --progress off >"$work/run.log" 2>&1 &
    run_pid=$!
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http_port/readyz")" = 200 ]; do
        kill -0 "$run_pid" || { echo "certwatch run exited; log: $work/run.log" >&2; exit 1; }
        sleep 0.2
    done
    ready=$(date +%s.%N)
}

stop_sim_and_run() {
    [ -n "$run_pid" ] && kill "$run_pid" 2>/dev/null && wait "$run_pid" 2>/dev/null
    [ -n "$sim_pid" ] && kill "$sim_pid" 2>/dev/null && wait "$sim_pid" 2>/dev/null
    rm -rf "$certs"
}
