"""The envelope the library writes, compared with a golden file that the Rust contracts
crate decodes in its own tests (shared/contracts/tests/envelope.rs): if either side
changes the wire form, one of the two suites fails."""

from __future__ import annotations

import json
import math
from pathlib import Path

from trainyard.messages import PROGRESS, build_report, finite_metrics

GOLDEN = Path(__file__).parent / "golden" / "worker-progress-non-finite.json"


def test_a_progress_report_with_non_finite_metrics_matches_the_golden_envelope() -> None:
    metrics, dropped = finite_metrics(
        {"loss": math.nan, "grad_norm": math.inf, "neg": -math.inf, "accuracy": 0.5}
    )
    assert dropped == ["loss"]
    report = build_report(
        PROGRESS,
        "ml",
        "bert",
        "worker-0",
        {"workerIndex": 0, "attempt": 1, "epoch": 3, "step": 300, "totalEpochs": 10, "metrics": metrics},
    )
    produced = json.loads(report.body)
    golden = json.loads(GOLDEN.read_text())
    # Ids and times differ on every call; the golden file holds fixed ones.
    for key in ("id", "correlationId", "time"):
        produced[key] = golden[key]
    assert produced == golden
    # The raw bytes hold plain numbers, never a NaN or Infinity literal.
    assert b"NaN" not in report.body and b"Infinity" not in report.body
    assert b"1.7976931348623157e+308" in report.body
