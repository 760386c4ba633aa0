"""`trainyard-run`: report a script's metrics without changing it.

```sh
trainyard-run -- python train.py --lr 0.1
```

runs the command, copies its output through, and turns every line holding
`key=value` pairs with numeric values into a progress report, as Katib's stdout
metrics collector does: `epoch=3 loss=0.21 accuracy=0.93`. `epoch` and `step` are the
position (a line without `epoch` keeps the last one seen); every other pair is a
metric. A stop command to the job sends SIGTERM to the command; SIGTERM and SIGINT
sent to the wrapper are passed on. The wrapper exits with the command's exit code
(128 + N when signal N ended it, as a shell reports).
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, TextIO

from .reporter import Reporter

# Katib's default metric filter, with NaN and Infinity accepted as values too.
_PAIR = re.compile(
    r"([\w|-]+)\s*=\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:nan|inf(?:inity)?))(?![\w.])",
    re.IGNORECASE,
)


@dataclass
class MetricLine:
    epoch: Optional[int]
    step: Optional[int]
    metrics: Dict[str, float] = field(default_factory=dict)


def parse_line(line: str) -> Optional[MetricLine]:
    """The position and metrics a line reports, or None when it reports none."""
    pairs = _PAIR.findall(line)
    if not pairs:
        return None
    parsed = MetricLine(epoch=None, step=None)
    for key, value in pairs:
        number = float(value)
        if key == "epoch":
            parsed.epoch = int(number)
        elif key == "step":
            parsed.step = int(number)
        else:
            parsed.metrics[key] = number
    return parsed


class StdoutCollector:
    """Feeds lines to a Reporter, tracking the position across lines."""

    def __init__(self, reporter: Reporter, metric_names: Sequence[str] = ()) -> None:
        self.reporter = reporter
        self.metric_names = set(metric_names)
        self.epoch = 0
        self.step = 0

    def feed(self, line: str) -> None:
        parsed = parse_line(line)
        if parsed is None:
            return
        self.epoch = parsed.epoch if parsed.epoch is not None else self.epoch
        self.step = parsed.step if parsed.step is not None else self.step
        metrics = {
            k: v for k, v in parsed.metrics.items() if not self.metric_names or k in self.metric_names
        }
        if metrics or parsed.epoch is not None:
            self.reporter.progress(self.epoch, step=self.step, metrics=metrics)


def _copy(stream: TextIO, sink: TextIO, collector: StdoutCollector) -> None:
    for line in stream:
        sink.write(line)
        sink.flush()
        collector.feed(line)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trainyard-run",
        description="Run a training command and report its key=value metric lines to Trainyard.",
    )
    parser.add_argument(
        "--metric",
        action="append",
        default=[],
        help="report only this metric (repeatable; default: every key=value pair)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")

    with Reporter() as reporter:
        collector = StdoutCollector(reporter, args.metric)
        child = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )

        def forward(signum: int, _frame: object) -> None:
            child.send_signal(signum)

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, forward)
        copiers = [
            threading.Thread(target=_copy, args=(child.stdout, sys.stdout, collector), daemon=True),
            threading.Thread(target=_copy, args=(child.stderr, sys.stderr, collector), daemon=True),
        ]
        for copier in copiers:
            copier.start()
        stop_sent = False
        while True:
            try:
                code = child.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if reporter.stop_requested and not stop_sent:
                    child.terminate()
                    stop_sent = True
        for copier in copiers:
            copier.join()
    # A command ended by a signal exits as a shell reports it: 128 + the signal number.
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
