#!/usr/bin/env bash
# Starts a local NATS server with JetStream and the seven Trainyard services as
# separate processes (as in production), shows their health, and stops everything
# on Ctrl-C. `--for SECONDS` stops by itself (used by CI-like headless runs).
# `--kubeconfig FILE` (or KUBECONFIG, or ~/.kube/config) gives the watcher and the
# planner a cluster; without one they are not started, since they need a
# Kubernetes API and the simulated cluster does not exist yet.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/deps.sh
ensure_nats_server

run_for=""
kubeconfig="${KUBECONFIG:-}"
[ -z "$kubeconfig" ] && [ -f "$HOME/.kube/config" ] && kubeconfig="$HOME/.kube/config"
while [ $# -gt 0 ]; do
  case "$1" in
    --for) run_for="$2"; shift 2 ;;
    --kubeconfig) kubeconfig="$2"; shift 2 ;;
    *) echo "usage: scripts/demo.sh [--kubeconfig FILE] [--for SECONDS]" >&2; exit 2 ;;
  esac
done

services=(gpu-allocator hpo-tuner checkpoint-manager cost-optimizer notifier)
if [ -n "$kubeconfig" ]; then
  [ -f "$kubeconfig" ] || { echo "kubeconfig $kubeconfig not found" >&2; exit 2; }
  export KUBECONFIG="$kubeconfig"
  services=(watcher planner "${services[@]}")
else
  echo "note: no kubeconfig; the watcher and planner need a Kubernetes API and are not started"
fi
echo "== building the services (release)"
cargo build --release --locked $(printf -- '-p trainyard-%s ' "${services[@]}")

work=$(mktemp -d -t trainyard-demo.XXXXXX)
nats_port=${TRAINYARD_DEMO_NATS_PORT:-4222}
pids=()
stop_all() {
  trap - INT TERM EXIT
  echo
  echo "== stopping"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo "logs kept in $work"
}
trap stop_all INT TERM EXIT

nats-server -js -a 127.0.0.1 -p "$nats_port" -sd "$work/jetstream" >"$work/nats.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/"$nats_port") 2>/dev/null && break; sleep 0.1; done

port=9101
declare -A http_port
for service in "${services[@]}"; do
  http_port[$service]=$port
  TRAINYARD_NATS__URL="nats://127.0.0.1:$nats_port" \
  TRAINYARD_HTTP__LISTEN="127.0.0.1:$port" \
    "target/release/trainyard-$service" >"$work/$service.log" 2>&1 &
  pids+=($!)
  port=$((port + 1))
done

ready() { curl -fsS "http://127.0.0.1:$1/readyz" >/dev/null 2>&1; }
for service in "${services[@]}"; do
  for _ in $(seq 1 100); do ready "${http_port[$service]}" && break; sleep 0.1; done
done

printf '\n%-20s %-8s %-28s %s\n' SERVICE READY METRICS LOG
for service in "${services[@]}"; do
  p=${http_port[$service]}
  state=no; ready "$p" && state=yes
  printf '%-20s %-8s %-28s %s\n' "$service" "$state" "http://127.0.0.1:$p/metrics" "$work/$service.log"
done
echo
echo "NATS: nats://127.0.0.1:$nats_port   (Ctrl-C stops everything)"

if [ -n "$run_for" ]; then
  sleep "$run_for"
else
  wait "${pids[0]}"
fi
