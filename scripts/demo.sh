#!/usr/bin/env bash
# The demo. Starts a local NATS server with JetStream, the seven Trainyard services
# as separate processes (as in production) and, unless a cluster is given, the
# simulated cluster of simulator/clusters/demo.yaml. Then applies the example
# TrainingJobs (one goes idle and is suspended for it) and the example Sweep,
# shows them live (like `kubectl get trainingjobs -w`) until all have finished
# or are suspended, prints a summary, the cost (by job and queue, spot vs
# on-demand, budget alerts, idle suspensions) and
# what became of gpt-resume's checkpoints (the simulated workers write real ones
# under the work directory: the one resumed from, one killed mid-save and
# skipped, those retention deleted, model registration), and stops everything.
# Ctrl-C stops everything at any time.
#
# NATS runs with authentication on, as in production: its users and allow lists
# are generated from shared/contracts (nats-auth-config), with passwords made
# for this run; every service connects as its own user, the CLI and the
# simulator as operator, and the workers with their job's token, which the
# planner issues and checks (the auth callout, docs/security.md).
#
#   scripts/demo.sh [--kubeconfig FILE] [--speed N] [--timeout SECONDS] [--keep-running] [--observe]
#
# --kubeconfig FILE  run against a real cluster instead of the simulator (the CRDs in
#                    crds/ must be installed, and its pods must reach this machine's NATS
#                    at TRAINYARD_DEMO_WORKER_NATS_URL to report progress).
# --speed N          simulated seconds per real second (default: the cluster file's).
# --timeout SECONDS  give up waiting for the jobs after this long (default 600).
# --keep-running     after the summary, keep everything running until Ctrl-C.
# --observe          also run Prometheus (Debian's package) with the alert rules,
#                    scraping the services; print its URL and the alerts that fired.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/deps.sh
ensure_nats_server

kubeconfig=""
speed=""
timeout=600
keep_running=no
observe=no
usage="usage: scripts/demo.sh [--kubeconfig FILE] [--speed N] [--timeout SECONDS] [--keep-running] [--observe]"
while [ $# -gt 0 ]; do
  case "$1" in
    --kubeconfig) kubeconfig="${2:?$usage}"; shift 2 ;;
    --speed) speed="${2:?$usage}"; shift 2 ;;
    --timeout) timeout="${2:?$usage}"; shift 2 ;;
    --keep-running) keep_running=yes; shift ;;
    --observe) observe=yes; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
if [ -n "$kubeconfig" ] && [ ! -f "$kubeconfig" ]; then
  echo "kubeconfig $kubeconfig not found" >&2
  exit 2
fi

services=(watcher planner gpu-allocator hpo-tuner checkpoint-manager cost-optimizer notifier)
echo "== building the simulator, the trainyard CLI, the NATS config generator and the seven services (release)"
cargo build --release --locked -p trainyard-simulator -p trainyard-cli -p trainyard-contracts \
  $(printf -- '-p trainyard-%s ' "${services[@]}")

work=$(mktemp -d -t trainyard-demo.XXXXXX)
nats_port=${TRAINYARD_DEMO_NATS_PORT:-4222}
nats_url="nats://127.0.0.1:$nats_port"
pids=()
stop_all() {
  trap - INT TERM EXIT
  echo
  echo "== stopping"
  # Services and the simulator first, NATS last, so nobody loses its server mid-drain.
  for pid in "${pids[@]:1}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]:1}"; do wait "$pid" 2>/dev/null || true; done
  kill -TERM "${pids[0]}" 2>/dev/null || true
  wait "${pids[0]}" 2>/dev/null || true
  echo "logs kept in $work"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# Notifications: a local receiver stands in for Slack; the notifier posts there,
# each message is printed as it would read in Slack, and the summary counts
# messages and events by type.
notifications_start() {
  local port=${TRAINYARD_DEMO_SLACK_PORT:-9130}
  notifications_log="$work/notifications.types"
  : >"$notifications_log"
  echo "http://127.0.0.1:$port/slack" >"$work/slack-webhook-url"
  cat >"$work/notifier-routes.yaml" <<ROUTES
route:
  receiver: slack
  group_by: [event, namespace, owner]
  group_wait: 2s
  group_interval: 5s
receivers:
  - name: slack
    slack: {channel: "#training", webhook_url_file: $work/slack-webhook-url}
ROUTES
  python3 scripts/lib/slack_receiver.py "$port" "$notifications_log" &
  pids+=($!)
  export TRAINYARD_NOTIFIER__ROUTES_FILE="$work/notifier-routes.yaml"
}
notifications_summary() {
  echo
  echo "== notifications (messages, events by type)"
  awk '{m[$1]++; e[$1]+=$2} END {for (t in m) printf "%-20s %3d messages %4d events\n", t, m[t], e[t]}' \
    "$notifications_log" | sort
}

# NATS credentials for this run only: a password per user, the callout
# issuer's key (the planner signs the workers' tokens with it).
secrets="$work/secrets"
mkdir -m 700 "$secrets"
nats_env=()
for user in "${services[@]}" operator; do
  # nats-server reads a variable's value as a configuration value, so a
  # password that starts with a digit would be taken for a number: a letter first.
  python3 -c 'import secrets; print("p" + secrets.token_hex(24))' >"$secrets/$user"
  variable="TRAINYARD_NATS_PASSWORD_$(echo "$user" | tr 'a-z-' 'A-Z_')"
  nats_env+=("$variable=$(cat "$secrets/$user")")
done
callout_issuer=$(target/release/nats-auth-config --new-callout-issuer "$secrets/callout-issuer.nk")
nats_env+=("TRAINYARD_NATS_CALLOUT_ISSUER=$callout_issuer")
target/release/nats-auth-config --out "$work/auth.conf" >/dev/null
echo 'include auth.conf' >"$work/nats.conf"
env "${nats_env[@]}" nats-server -c "$work/nats.conf" -js -a 127.0.0.1 -p "$nats_port" \
  -sd "$work/jetstream" >"$work/nats.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/"$nats_port") 2>/dev/null && break; sleep 0.1; done

simulated=no
checkpoint_root="$work/checkpoints"
if [ -z "$kubeconfig" ]; then
  simulated=yes
  kubeconfig="$work/kubeconfig"
  target/release/trainyard-simulator --config simulator/clusters/demo.yaml \
    --kubeconfig-out "$kubeconfig" --nats-url "$nats_url" ${speed:+--speed "$speed"} \
    --nats-user operator --nats-password-file "$secrets/operator" \
    --checkpoint-root "$checkpoint_root" >"$work/simulator.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do [ -s "$kubeconfig" ] && break; sleep 0.1; done
  [ -s "$kubeconfig" ] || { echo "the simulator did not start; see $work/simulator.log" >&2; exit 1; }
  queue=simulator/clusters/demo-queue.yaml
  echo "== simulated cluster: simulator/clusters/demo.yaml (a simulator, not Kubernetes)"
  echo "   its workers' checkpoints: $checkpoint_root"
  worker_nats_url="$nats_url"
  # The checkpoint-manager reads (and retention deletes) the workers' s3:// checkpoints
  # through the simulator's S3 endpoint, which serves $checkpoint_root/s3.
  simulator_url=$(sed -n 's/^ *server: //p' "$kubeconfig")
  export TRAINYARD_CHECKPOINT_MANAGER__S3_ENDPOINT="$simulator_url/s3" \
    TRAINYARD_CHECKPOINT_MANAGER__S3_REGION=us-east-1 \
    TRAINYARD_CHECKPOINT_MANAGER__S3_ACCESS_KEY_ID=simulator \
    TRAINYARD_CHECKPOINT_MANAGER__S3_SECRET_ACCESS_KEY=simulator
  # gpt-resume starts from a checkpoint of an earlier run (its spec.checkpoint.resumeFrom),
  # written here by the worker library's own CheckpointWriter.
  ensure_nats_py
  PYTHONPATH=sdk/python/src python3 - "$checkpoint_root/s3/checkpoints/gpt-training/checkpoint-epoch-10" <<'PY'
import sys
from trainyard.checkpoint import CheckpointWriter
with CheckpointWriter(sys.argv[1], epoch=10, step=1000, metrics={"loss": 1.2}) as ckpt:
    ckpt.write_bytes("model.bin", bytes(4096))
    ckpt.write_bytes("optimizer.bin", bytes(2048))
PY
else
  queue=examples/trainingqueue-default.yaml
  echo "== cluster: $kubeconfig"
  worker_nats_url="${TRAINYARD_DEMO_WORKER_NATS_URL:-$nats_url}"
fi
export KUBECONFIG="$kubeconfig"

notifications_start
# The cost-optimizer prices the nodes with deploy/price-catalog.yaml (the file
# inside its ConfigMap) and runs its accounting, budget and idle checks every 5 s.
python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["data"]["price-catalog.yaml"])' \
  deploy/price-catalog.yaml >"$work/price-catalog.yaml"
export TRAINYARD_COST_OPTIMIZER__CATALOG_PATH="$work/price-catalog.yaml" \
  TRAINYARD_COST_OPTIMIZER__ACCOUNTING_INTERVAL_SECONDS=5
port=9101
declare -A http_port
for service in "${services[@]}"; do
  http_port[$service]=$port
  TRAINYARD_NATS__URL="$nats_url" \
  TRAINYARD_NATS__USER="$service" \
  TRAINYARD_NATS__PASSWORD_FILE="$secrets/$service" \
  TRAINYARD_PLANNER__WORKER_CREDENTIALS_SEED_FILE="$secrets/callout-issuer.nk" \
  TRAINYARD_HTTP__LISTEN="127.0.0.1:$port" \
  TRAINYARD_PLANNER__WORKER_NATS_URL="$worker_nats_url" \
  TRAINYARD_PLANNER__RESTART_BACKOFF_INITIAL_SECONDS=2 \
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
echo "NATS: $nats_url (user operator, password in $secrets/operator)   KUBECONFIG=$kubeconfig"
if [ "$observe" = yes ]; then
  source scripts/lib/prometheus.sh
  ensure_prometheus >/dev/null
  targets=()
  for service in "${services[@]}"; do targets+=("$service=127.0.0.1:${http_port[$service]}"); done
  prometheus_port=${TRAINYARD_DEMO_PROMETHEUS_PORT:-9190}
  start_prometheus "$work/prometheus" "$prometheus_port" "${targets[@]}"
  pids+=("$(cat "$work/prometheus/prometheus.pid")")
  observed_from=$(date +%s)
  echo "Prometheus: http://127.0.0.1:$prometheus_port (alerts: http://127.0.0.1:$prometheus_port/alerts)"
fi

# The CLI connects to NATS as operator.
trainyard() {
  TRAINYARD_NATS_URL="$nats_url" TRAINYARD_NATS_USER=operator \
    TRAINYARD_NATS_PASSWORD_FILE="$secrets/operator" target/release/trainyard "$@"
}
echo
echo "== applying the queue, the example TrainingJobs and the example Sweep with its checkpoint claim"
trainyard apply -f "$queue" \
  -f examples/trainingjob-simple.yaml -f examples/trainingjob-distributed.yaml \
  -f examples/trainingjob-resume.yaml -f examples/trainingjob-advanced.yaml \
  -f examples/trainingjob-idle.yaml -f examples/sweep-checkpoints.yaml -f examples/sweep.yaml
echo
echo "== watching (trainyard get trainingjobs -A -w), until every job has finished"
status=0
trainyard get trainingjobs -A --until-done --timeout "$timeout" || status=$?
echo
echo "== sweeps"
trainyard get sweeps -A -o wide || status=$?
echo
echo "== summary"
trainyard summary -A || status=$?
notifications_summary
echo
echo "== cost (prices: deploy/price-catalog.yaml; GPU time on the wall clock, as the cost-optimizer counts it)"
trainyard cost --by job -A || status=$?
echo
trainyard cost --by queue -A || status=$?
curl -fsS "http://127.0.0.1:${http_port[cost-optimizer]}/metrics" >"$work/cost-optimizer.metrics" 2>/dev/null || true
trainyard get trainingjobs -A -o json >"$work/trainingjobs.json" || status=$?
trainyard get trainingqueues -o json >"$work/trainingqueues.json" || status=$?
python3 scripts/lib/cost_summary.py "$work/cost-optimizer.metrics" "$work/trainingjobs.json" \
  "$work/trainingqueues.json" || status=$?
echo
echo "== one finished job in full (trainyard describe tj mnist-training -n ml-training)"
trainyard describe tj mnist-training -n ml-training || status=$?
echo
echo "== checkpoints of gpt-resume (trainyard describe tj gpt-resume): where it resumed, what was skipped"
trainyard describe tj gpt-resume -n default || status=$?
echo
echo "== its rank 0's log (trainyard logs gpt-resume): the resume point it read, its saves"
trainyard logs gpt-resume -n default | grep -E 'resuming from|checkpoint|killed' || true
if [ "$simulated" = yes ]; then
  echo
  echo "== its checkpoints on disk ($checkpoint_root/s3/ml-checkpoints/default/gpt-resume); retention (keepLast: 2) deleted the rest"
  for dir in "$checkpoint_root"/s3/ml-checkpoints/default/gpt-resume/*/; do
    [ -d "$dir" ] || continue
    if [ -f "$dir/trainyard-manifest.json" ]; then state="complete (trainyard-manifest.json)"; else state="INCOMPLETE: no manifest, never resumed from"; fi
    printf '  %-22s %s\n' "$(basename "$dir")" "$state"
  done
  deleted=$(curl -fsS "http://127.0.0.1:${http_port[checkpoint-manager]}/metrics" 2>/dev/null \
    | awk '/^trainyard_checkpoint_retention_deleted_total/ {n+=$2} END {print n+0}')
  verified=$(curl -fsS "http://127.0.0.1:${http_port[checkpoint-manager]}/metrics" 2>/dev/null \
    | awk '/^trainyard_checkpoint_verifications_total\{outcome="verified"\}/ {print $2+0}')
  incomplete=$(curl -fsS "http://127.0.0.1:${http_port[checkpoint-manager]}/metrics" 2>/dev/null \
    | awk '/^trainyard_checkpoint_verifications_total\{outcome="incomplete"\}/ {print $2+0}')
  echo "all jobs: ${verified:-0} checkpoint reports verified, ${incomplete:-0} incomplete (killed saves), ${deleted:-0} checkpoints deleted by retention"
fi
if [ -n "${TRAINYARD_CHECKPOINT_MANAGER__MLFLOW_TRACKING_URI:-}" ]; then
  echo "model registration: each completed job's best checkpoint is a version in $TRAINYARD_CHECKPOINT_MANAGER__MLFLOW_TRACKING_URI (Model: above)"
else
  echo "model registration is off (no MLflow): set TRAINYARD_CHECKPOINT_MANAGER__MLFLOW_TRACKING_URI=http://HOST:5000 to register each completed job's best checkpoint"
fi
if [ "$observe" = yes ]; then
  echo
  echo "== alerts that fired during the run (http://127.0.0.1:$prometheus_port/alerts)"
  prometheus_alerts_fired "http://127.0.0.1:$prometheus_port" $(( $(date +%s) - observed_from + 1 )) || status=$?
fi

if [ "$keep_running" = yes ]; then
  echo
  echo "everything is still running (KUBECONFIG=$kubeconfig); Ctrl-C stops it"
  echo "kubectl works against it too: KUBECONFIG=$kubeconfig kubectl get tj -A -w"
  wait "${pids[0]}"
else
  echo
  echo "rerun with --keep-running to explore the cluster with kubectl: kubectl get tj -A -w, kubectl describe tj NAME"
fi
exit "$status"
