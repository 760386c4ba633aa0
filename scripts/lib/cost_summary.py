"""The demo's cost summary: how the money split between spot and on-demand
(the cost-optimizer's trainyard_cost_dollars_total by capacity_type), the
capacity each `capacityType: any` job was given and why, budget alerts
(the TrainingQueues' status.budget) and the jobs suspended for idle GPUs
with their reason.

usage: cost_summary.py COST_OPTIMIZER_METRICS_FILE JOBS_JSON QUEUES_JSON
"""
import json
import re
import sys

metrics_file, jobs_file, queues_file = sys.argv[1:4]

split = {}
pattern = re.compile(r'^trainyard_cost_dollars_total\{(.*)\} (\S+)$')
for line in open(metrics_file):
    match = pattern.match(line.strip())
    if match:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        kind = labels.get("capacity_type", "?")
        split[kind] = split.get(kind, 0.0) + float(match.group(2))
total = sum(split.values())
print("spend by capacity type (trainyard_cost_dollars_total):")
for kind in sorted(split):
    share = split[kind] / total * 100 if total else 0.0
    print(f"  {kind:<10} {split[kind]:8.2f} USD  {share:5.1f}%")
if not split:
    print("  nothing priced yet")

jobs = json.load(open(jobs_file)).get("items", [])
print("capacity chosen by the cost-optimizer (capacityType: any):")
chosen = 0
for job in jobs:
    cost = (job.get("status") or {}).get("cost") or {}
    if cost.get("capacityType"):
        chosen += 1
        name = f'{job["metadata"].get("namespace", "default")}/{job["metadata"]["name"]}'
        print(f'  {name:<34} {cost["capacityType"]:<10} {cost.get("decision", "")}')
if not chosen:
    print("  no job left the choice to it")

print("budget alerts:")
budgets = 0
for queue in json.load(open(queues_file)).get("items", []):
    budget = (queue.get("status") or {}).get("budget")
    if not budget:
        continue
    budgets += 1
    crossed = budget.get("thresholdsCrossed", [])
    print(f'  queue {queue["metadata"]["name"]}: {budget["state"]}, spent {budget["spent"]:.2f} of '
          f'{budget["amount"]:.2f} {budget["currency"]} ({budget["spent"] / budget["amount"] * 100:.1f}%); '
          f'thresholds crossed: {", ".join(f"{t}%" for t in crossed) or "none"}')
if not budgets:
    print("  no queue has a budget")

print("suspended for idle GPUs:")
idle = 0
for job in jobs:
    for condition in (job.get("status") or {}).get("conditions", []):
        if condition.get("type") == "Suspended" and condition.get("reason") == "IdleSuspended":
            idle += 1
            name = f'{job["metadata"].get("namespace", "default")}/{job["metadata"]["name"]}'
            print(f"  {name}: {condition.get('message', '')}")
if not idle:
    print("  none")
