#!/usr/bin/env python3
"""Optuna side of the hpo-tuner sampler comparison.

Runs Optuna's default TPESampler (seeded, nothing else changed) on Branin and
Hartmann6 with the same trial budget and the same measurements as the Rust
binary `hpo_tpe_bench`, and writes one JSON document that the Rust binary reads
to print both sides next to each other.

Measurements (identical definitions on both sides):
  * simple regret at trial t = min(f(x_1..x_t)) - f*, for t in --checkpoints;
  * suggest time at trial N = wall time of producing the parameters of trial N
    (here: study.ask() plus the suggest_float calls, i.e. everything the sampler
    does; study.tell() is not timed), averaged over trials N-9..N, then over seeds.

Usage (see services/hpo-tuner/core/README.md):
  python3 -m venv /tmp/hpo-venv
  /tmp/hpo-venv/bin/pip install -r loadtest/hpo/requirements.txt
  /tmp/hpo-venv/bin/python loadtest/hpo/optuna_bench.py --out loadtest/out/optuna.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings

import optuna

BRANIN_OPT = 0.397887357729738
HARTMANN6_OPT = -3.32236801141551

H6_ALPHA = [1.0, 1.2, 3.0, 3.2]
H6_A = [
    [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
    [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
    [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
    [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
]
H6_P = [
    [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
    [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
    [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
    [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
]


def branin(x: list[float]) -> float:
    x1, x2 = x
    b = 5.1 / (4.0 * math.pi**2)
    c = 5.0 / math.pi
    t = 1.0 / (8.0 * math.pi)
    return (x2 - b * x1 * x1 + c * x1 - 6.0) ** 2 + 10.0 * (1.0 - t) * math.cos(x1) + 10.0


def hartmann6(x: list[float]) -> float:
    total = 0.0
    for i in range(4):
        inner = sum(H6_A[i][j] * (x[j] - H6_P[i][j]) ** 2 for j in range(6))
        total += H6_ALPHA[i] * math.exp(-inner)
    return -total


FUNCTIONS = {
    "branin": (branin, [(-5.0, 10.0), (0.0, 15.0)], BRANIN_OPT),
    "hartmann6": (hartmann6, [(0.0, 1.0)] * 6, HARTMANN6_OPT),
}


def run_one(name: str, seed: int, n_trials: int, multivariate: bool | None):
    func, bounds, fstar = FUNCTIONS[name]
    kwargs = {"seed": seed}
    if multivariate is not None:
        kwargs["multivariate"] = multivariate
    sampler = optuna.samplers.TPESampler(**kwargs)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    best = math.inf
    regrets = []  # regret after trial t (index t-1)
    times = []  # suggest seconds of trial t (index t-1)
    for _ in range(n_trials):
        t0 = time.perf_counter()
        trial = study.ask()
        x = [trial.suggest_float(f"x{i}", lo, hi) for i, (lo, hi) in enumerate(bounds)]
        times.append(time.perf_counter() - t0)
        y = func(x)
        study.tell(trial, y)
        best = min(best, y)
        regrets.append(best - fstar)
    return regrets, times


def window_mean(times: list[float], n: int) -> float:
    lo = max(0, n - 10)
    w = times[lo:n]
    return sum(w) / len(w)


def quartiles(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(sorted(xs), n=4, method="inclusive")
    return {"q1": q[0], "median": q[1], "q3": q[2]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--seed-offset", type=int, default=0)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--checkpoints", default="25,50,100")
    ap.add_argument("--timing-seeds", type=int, default=3)
    ap.add_argument("--timing-trials", type=int, default=2000)
    ap.add_argument("--functions", default="branin,hartmann6")
    ap.add_argument(
        "--multivariate",
        choices=["default", "true", "false"],
        default="default",
        help="default = Optuna's own default (multivariate for single objective in Optuna 5)",
    )
    ap.add_argument("--out", default="-")
    args = ap.parse_args()

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore")
    mv = {"default": None, "true": True, "false": False}[args.multivariate]
    checkpoints = [int(c) for c in args.checkpoints.split(",") if c]

    doc = {
        "optimizer": f"optuna {optuna.__version__} TPESampler(multivariate={args.multivariate})",
        "seeds": args.seeds,
        "trials": args.trials,
        "functions": {},
    }
    for name in args.functions.split(","):
        per_seed = []
        times_at = {}
        for s in range(args.seeds):
            seed = args.seed_offset + s
            regrets, times = run_one(name, seed, args.trials, mv)
            per_seed.append({"seed": seed, "regret": {str(c): regrets[c - 1] for c in checkpoints}})
            times_at.setdefault(str(args.trials), []).append(window_mean(times, args.trials))
        summary = {
            str(c): quartiles([p["regret"][str(c)] for p in per_seed]) for c in checkpoints
        }
        suggest_ms = {str(args.trials): 1e3 * statistics.mean(times_at[str(args.trials)])}
        if args.timing_seeds > 0 and args.timing_trials > args.trials:
            long_times = []
            for s in range(args.timing_seeds):
                _, times = run_one(name, args.seed_offset + s, args.timing_trials, mv)
                long_times.append(window_mean(times, args.timing_trials))
            suggest_ms[str(args.timing_trials)] = 1e3 * statistics.mean(long_times)
        doc["functions"][name] = {
            "per_seed": per_seed,
            "regret": summary,
            "suggest_ms": suggest_ms,
        }
        print(
            f"{name}: "
            + "  ".join(
                f"regret@{c} median {summary[str(c)]['median']:.4f} "
                f"[{summary[str(c)]['q1']:.4f}, {summary[str(c)]['q3']:.4f}]"
                for c in checkpoints
            )
            + "  suggest ms "
            + "  ".join(f"@{k} {v:.3f}" for k, v in suggest_ms.items()),
            file=sys.stderr,
        )

    text = json.dumps(doc, indent=1)
    if args.out == "-":
        print(text)
    else:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
