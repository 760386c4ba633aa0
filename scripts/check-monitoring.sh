#!/usr/bin/env bash
# Checks the operations files against the real tools:
#   1. the PrometheusRule's groups with `promtool check rules`, and its unit
#      tests (deploy/monitoring/alerts.test.yaml) with `promtool test rules`;
#   2. every Grafana dashboard's structure, and every PromQL expression in it
#      parsed by promtool;
#   3. `kubectl kustomize` renders deploy/ (a Service per Deployment, the
#      ServiceMonitor, rules, PriorityClasses) and deploy/ml-namespace/;
#   4. compose/: every component, restart policies, healthchecks, mounted files,
#      its Prometheus config and rules; the Dockerfiles with hadolint;
#   5. unless --static: a real Prometheus server scrapes the seven services
#      running against the simulator, every metric the dashboards and alerts use
#      exists, and a failing job makes TrainyardJobFailed fire.
#
#   scripts/check-monitoring.sh [--static]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/deps.sh
source scripts/lib/prometheus.sh
ensure_prometheus
ensure_hadolint
live=yes
[ "${1:-}" = --static ] && live=no

work=$(mktemp -d -t trainyard-monitoring.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

echo "== promtool check rules / test rules"
prometheus_rules_file "$work/rules.yaml"
promtool check rules "$work/rules.yaml"
cp deploy/monitoring/alerts.test.yaml "$work/"
promtool test rules "$work/alerts.test.yaml"
# Every alert has a unit test.
python3 - "$work/rules.yaml" deploy/monitoring/alerts.test.yaml <<'PY'
import sys, yaml
alerts = {r["alert"] for g in yaml.safe_load(open(sys.argv[1]))["groups"] for r in g["rules"] if "alert" in r}
tested = {c["alertname"] for t in yaml.safe_load(open(sys.argv[2]))["tests"] for c in t.get("alert_rule_test", [])
          if c.get("exp_alerts")}
missing = sorted(alerts - tested)
if missing:
    sys.exit(f"alerts without a firing unit test: {missing}")
print(f"  {len(alerts)} alerts, each with a firing unit test")
PY

echo "== dashboards: structure, and every expression parsed by promtool"
python3 - "$work" <<'PY'
import glob, json, re, sys, yaml
work = sys.argv[1]
rules, metrics = [], set()
# Grafana's variables, replaced by values PromQL accepts.
variables = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
for path in sorted(glob.glob("deploy/monitoring/dashboards/*.json")):
    board = json.load(open(path))
    for key in ("uid", "title", "panels", "templating"):
        assert key in board, f"{path}: no {key}"
    names = {v["name"] for v in board["templating"]["list"]}
    assert "datasource" in names, f"{path}: no datasource variable"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), f"{path}: panel ids repeat"
    for panel in board["panels"]:
        where = f"{path} panel {panel['id']} ({panel.get('title')})"
        for key in ("title", "type", "gridPos", "targets", "description"):
            assert panel.get(key), f"{where}: no {key}"
        for target in panel["targets"]:
            expr = target["expr"]
            for var, value in variables.items():
                expr = expr.replace(var, value)
            expr = re.sub(r"\$\{?(\w+)\}?", ".*", expr)
            rules.append({"record": f"dashboard:{len(rules)}", "expr": expr})
    for var in board["templating"]["list"]:
        query = var.get("definition", "")
        m = re.match(r"label_values\((\w+),", query)
        if m:
            metrics.add(m.group(1))
print(f"  {len(rules)} expressions in {len(glob.glob('deploy/monitoring/dashboards/*.json'))} dashboards")
yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}, open(f"{work}/dashboards.rules.yaml", "w"))
# Metric names the dashboards and alerts use, for the scrape check.
groups = yaml.safe_load(open(f"{work}/rules.yaml"))["groups"]
exprs = [r["expr"] for r in rules] + [r["expr"] for g in groups for r in g["rules"]]
for expr in exprs:
    metrics.update(re.findall(r"\b((?:trainyard|process)_[a-z0-9_]+|up)\b(?!\s*\()", expr))
open(f"{work}/metrics.txt", "w").write("\n".join(sorted(metrics)) + "\n")
PY
promtool check rules "$work/dashboards.rules.yaml"

echo "== docs/crd-reference.md and docs/dashboards.md up to date"
python3 scripts/lib/gen_docs.py --check

echo "== kubectl kustomize deploy/ and deploy/ml-namespace/"
{ kubectl kustomize deploy/; echo ---; kubectl kustomize deploy/ml-namespace/; } >"$work/rendered.yaml"
python3 - "$work/rendered.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
kinds = {}
for d in docs:
    kinds.setdefault(d["kind"], []).append(d)
deployments = {d["metadata"]["name"] for d in kinds.get("Deployment", [])}
services = {d["metadata"]["name"] for d in kinds.get("Service", [])}
missing = sorted(deployments - services)
assert not missing, f"Deployments without a Service: {missing}"
monitored = {d["metadata"]["name"] for d in kinds.get("ServiceMonitor", [])}
assert monitored, "no ServiceMonitor"
for kind in ("PrometheusRule", "PriorityClass", "ResourceQuota", "LimitRange"):
    assert kind in kinds, f"no {kind} rendered"
images = sorted({c["image"] for d in kinds["Deployment"] for c in d["spec"]["template"]["spec"]["containers"]})
print(f"  {len(docs)} objects; {len(deployments)} Deployments, each with a Service; images {images}")
PY

echo "== compose/"
prometheus_rules_file "$work/compose-rules.yaml"
python3 - "$work/compose-rules.yaml" <<'PY'
import os, sys, yaml
assert yaml.safe_load(open("compose/prometheus/rules.yaml")) == yaml.safe_load(open(sys.argv[1])), \
    "compose/prometheus/rules.yaml differs from deploy/monitoring/prometheusrule.yaml; regenerate it"
compose = yaml.safe_load(open("compose/docker-compose.yaml"))
services = compose["services"]
for name in ("nats", "simulator", "prometheus", "grafana", "mlflow", "watcher", "planner", "gpu-allocator",
             "hpo-tuner", "checkpoint-manager", "cost-optimizer", "notifier", "webhook-sink"):
    assert name in services, f"compose lacks {name}"
for name, service in services.items():
    assert service.get("restart") == "unless-stopped", f"compose {name}: no restart policy"
    for dep, cond in (service.get("depends_on") or {}).items():
        assert dep in services, f"compose {name} depends on unknown {dep}"
        if cond["condition"] == "service_healthy":
            assert "healthcheck" in services[dep], f"compose {name} waits for {dep}, which has no healthcheck"
    for volume in service.get("volumes", []):
        source = volume.split(":")[0]
        if source.startswith("."):
            assert os.path.exists(os.path.join("compose", source)), f"compose {name}: {source} missing"
print(f"  {len(services)} services, restart policies, healthchecks waited on, mounted files present")
PY
promtool check config compose/prometheus/prometheus.yml >/dev/null

echo "== hadolint"
hadolint deploy/Dockerfile deploy/trainer/*.Dockerfile
echo "  clean"

[ "$live" = yes ] || exit 0

echo "== a real Prometheus scraping the services running against the simulator"
services=(watcher planner gpu-allocator hpo-tuner checkpoint-manager cost-optimizer notifier)
cargo build --locked -q -p trainyard-simulator -p trainyard-cli \
  $(printf -- '-p trainyard-%s ' "${services[@]}")
ensure_nats_server >/dev/null
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
nats_port=$(free_port)
nats_url="nats://127.0.0.1:$nats_port"
nats-server -js -a 127.0.0.1 -p "$nats_port" -sd "$work/jetstream" >"$work/nats.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/"$nats_port") 2>/dev/null && break; sleep 0.1; done
export KUBECONFIG="$work/kubeconfig"
target/debug/trainyard-simulator --config deploy/monitoring/test/cluster.yaml \
  --kubeconfig-out "$KUBECONFIG" --nats-url "$nats_url" >"$work/simulator.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do [ -s "$KUBECONFIG" ] && break; sleep 0.1; done
targets=()
for service in "${services[@]}"; do
  port=$(free_port)
  TRAINYARD_NATS__URL="$nats_url" TRAINYARD_HTTP__LISTEN="127.0.0.1:$port" \
  TRAINYARD_PLANNER__WORKER_NATS_URL="$nats_url" \
  TRAINYARD_PLANNER__RESTART_BACKOFF_INITIAL_SECONDS=1 \
    "target/debug/trainyard-$service" >"$work/$service.log" 2>&1 &
  pids+=($!)
  targets+=("$service=127.0.0.1:$port")
done
for target in "${targets[@]}"; do
  for _ in $(seq 1 200); do curl -fsS "http://${target#*=}/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
done
prom_port=$(free_port)
start_prometheus "$work/prometheus" "$prom_port" "${targets[@]}"
pids+=("$(cat "$work/prometheus/prometheus.pid")")
prom="http://127.0.0.1:$prom_port"

target/debug/trainyard apply -f deploy/monitoring/test/jobs.yaml
target/debug/trainyard get trainingjobs -A --until-done --timeout 180 || true

query() { curl -fsS --get "$prom/api/v1/query" --data-urlencode "query=$1" \
  | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["data"]["result"]))'; }
# Counters labelled by an event appear with its first occurrence; this run
# has no preemption and no dead letter (their alerts are unit-tested above).
first_event_only="trainyard_trainingjob_preemptions_total trainyard_dead_letters_total"
missing=()
for _ in $(seq 1 30); do
  missing=()
  while read -r metric; do
    case " $first_event_only " in *" $metric "*) continue ;; esac
    [ "$(query "count({__name__=\"$metric\"})")" -gt 0 ] || missing+=("$metric")
  done <"$work/metrics.txt"
  [ ${#missing[@]} -eq 0 ] && break
  sleep 1
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "metrics the dashboards or alerts use that no service exposes: ${missing[*]}" >&2
  exit 1
fi
echo "  all $(wc -l <"$work/metrics.txt") metrics present but the first-event-only ($first_event_only)"
fired=""
for _ in $(seq 1 30); do
  fired=$(prometheus_firing_alerts "$prom")
  grep -q '^TrainyardJobFailed .*reason=' <<<"$fired" && break
  sleep 1
done
echo "  firing:"
sed 's/^/    /' <<<"$fired"
grep -q '^TrainyardJobFailed .*namespace=ml-training' <<<"$fired" || {
  echo "TrainyardJobFailed did not fire for the failed jobs; logs in $work" >&2
  exit 1
}
echo "  TrainyardJobFailed fired for the failed jobs"
