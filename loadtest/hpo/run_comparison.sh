#!/usr/bin/env bash
# Runs the hpo-tuner sampler comparison against Optuna and the early-stopping
# benchmark. The Python venv lives outside the repository (default /tmp/hpo-venv).
#
#   loadtest/hpo/run_comparison.sh                 # 50 seeds, 100 trials, 3 seeds to 2000
#   SEEDS=10 TIMING_SEEDS=1 loadtest/hpo/run_comparison.sh   # quicker
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=${HPO_VENV:-/tmp/hpo-venv}
SEEDS=${SEEDS:-50}
TIMING_SEEDS=${TIMING_SEEDS:-3}
OUT=${OUT:-loadtest/out}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/tmp/target-hpo}

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet -r loadtest/hpo/requirements.txt
mkdir -p "$OUT"

"$VENV/bin/python" loadtest/hpo/optuna_bench.py \
    --seeds "$SEEDS" --timing-seeds "$TIMING_SEEDS" --out "$OUT/optuna.json"

cargo build --release -p trainyard-loadtest --bin hpo_tpe_bench --bin hpo_asha_bench
status=0
"$CARGO_TARGET_DIR/release/hpo_tpe_bench" --seeds "$SEEDS" --timing-seeds "$TIMING_SEEDS" \
    --variants tpe,optuna-defaults,independent,random --optuna "$OUT/optuna.json" || status=$?
"$CARGO_TARGET_DIR/release/hpo_asha_bench" --seeds "$SEEDS" || status=$?
exit $status
