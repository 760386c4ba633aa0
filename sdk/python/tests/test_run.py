from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import NatsServer, wait_for

from trainyard.run import parse_line


def test_key_value_lines_become_position_and_metrics() -> None:
    line = parse_line("epoch=3 step=300 loss=0.21, accuracy = 9.3e-1 grad=NaN lr=-inf")
    assert line is not None
    assert (line.epoch, line.step) == (3, 300)
    assert line.metrics["loss"] == 0.21 and line.metrics["accuracy"] == 0.93
    assert line.metrics["lr"] == float("-inf")
    assert line.metrics["grad"] != line.metrics["grad"]  # NaN, left out when reported


def test_lines_without_numeric_pairs_report_nothing() -> None:
    assert parse_line("Downloading dataset...") is None
    assert parse_line("version=1.2.3 name=nancy") is None


def worker_environment(server: NatsServer, tmp_path: Path) -> dict:
    return {
        **os.environ,
        "TRAINYARD_NAMESPACE": "ml",
        "TRAINYARD_JOB": "wrapped",
        "TRAINYARD_NATS_URL": server.url,
        "EPOCHS": "3",
        "PYTHONPATH": str(Path(__file__).parents[1] / "src"),
    }


def test_the_wrapper_reports_metric_lines_and_keeps_the_exit_code(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    script = (
        "import sys\n"
        "print('starting')\n"
        "for e in (1, 2, 3):\n"
        "    print(f'epoch={e} loss={1 / e:.3f}', flush=True)\n"
        "sys.exit(7)\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "trainyard", "--", sys.executable, "-c", script],
        env=worker_environment(nats_server, tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 7, result.stderr
    assert "starting" in result.stdout and "epoch=3 loss=0.333" in result.stdout
    reports = nats_server.stored_reports()
    assert [(r["payload"]["epoch"], r["payload"]["metrics"]) for r in reports] == [
        (1, {"loss": 1.0}),
        (2, {"loss": 0.5}),
        (3, {"loss": 0.333}),
    ]
    assert all(r["payload"]["totalEpochs"] == 3 for r in reports)


def test_a_stop_command_terminates_the_wrapped_command(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    script = "import time\nprint('epoch=1 loss=1', flush=True)\ntime.sleep(60)\n"
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "trainyard", "--", sys.executable, "-c", script],
        env=worker_environment(nats_server, tmp_path),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: len(nats_server.stored_reports()) == 1, timeout=20)
        started = time.monotonic()
        nats_server.publish("trainyard.commands.stop.ml.wrapped", {"reason": "early stop"})
        assert wrapper.wait(timeout=20) == 128 + 15  # SIGTERM ended the command
        assert time.monotonic() - started < 20
    finally:
        wrapper.kill()
