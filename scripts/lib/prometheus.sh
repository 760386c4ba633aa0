# A local Prometheus server (Debian's package) with Trainyard's alert rules,
# scraping services on loopback. Sourced by scripts/check-monitoring.sh and
# scripts/demo.sh --observe; ensure_prometheus (deps.sh) installs it.

# Writes the rule groups of deploy/monitoring/prometheusrule.yaml as a plain
# Prometheus rule file to $1.
prometheus_rules_file() {
  python3 - "$1" <<'PY'
import sys, yaml
rule = yaml.safe_load(open("deploy/monitoring/prometheusrule.yaml"))
with open(sys.argv[1], "w") as out:
    yaml.safe_dump(rule["spec"], out, sort_keys=False)
PY
}

# start_prometheus DIR PORT NAME=HOST:PORT...
# Starts Prometheus on 127.0.0.1:PORT with the alert rules, scraping and
# evaluating every second, one job `trainyard-NAME` per target. Prints its PID
# in DIR/prometheus.pid and logs to DIR/prometheus.log.
start_prometheus() {
  local dir=$1 port=$2
  shift 2
  mkdir -p "$dir"
  prometheus_rules_file "$dir/rules.yaml"
  {
    echo "global: {scrape_interval: 1s, evaluation_interval: 1s}"
    echo "rule_files: [rules.yaml]"
    echo "scrape_configs:"
    local target
    for target in "$@"; do
      echo "  - job_name: trainyard-${target%%=*}"
      echo "    static_configs: [{targets: ['${target#*=}']}]"
    done
  } >"$dir/prometheus.yml"
  promtool check config "$dir/prometheus.yml" >/dev/null
  prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
    --web.listen-address="127.0.0.1:$port" >"$dir/prometheus.log" 2>&1 &
  echo $! >"$dir/prometheus.pid"
  local _
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port/-/ready" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "Prometheus did not start; see $dir/prometheus.log" >&2
  return 1
}

# Names of the alerts firing now on the Prometheus at $1, one a line with its labels.
prometheus_firing_alerts() {
  curl -fsS "$1/api/v1/alerts" | python3 -c '
import json, sys
for alert in json.load(sys.stdin)["data"]["alerts"]:
    if alert["state"] == "firing":
        labels = alert["labels"]
        name = labels.pop("alertname")
        print(name, " ".join(f"{k}={v}" for k, v in sorted(labels.items())))
'
}

# Alerts that fired at any time in the last $2 seconds on the Prometheus at $1,
# one a line with its labels.
prometheus_alerts_fired() {
  curl -fsS --get "$1/api/v1/query" \
    --data-urlencode "query=max_over_time(ALERTS{alertstate=\"firing\"}[${2}s])" | python3 -c '
import json, sys
fired = json.load(sys.stdin)["data"]["result"]
for series in fired:
    labels = series["metric"]
    name = labels.pop("alertname")
    labels.pop("alertstate", None)
    print(name, " ".join(f"{k}={v}" for k, v in sorted(labels.items())))
if not fired:
    print("none")
'
}
