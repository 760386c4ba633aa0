"""Hugging Face Transformers: `Trainer(..., callbacks=[TrainyardCallback()])`.

Reports every log and evaluation (`logs`, `metrics`) as progress, stops training on
a stop command, asks the Trainer to save on a checkpoint-now command, and seals each
checkpoint the Trainer saves (`<output_dir>/checkpoint-<step>`) with the manifest,
then reports it.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Mapping, Optional

from transformers import TrainerCallback

from ..checkpoint import CheckpointError, seal_checkpoint
from ..reporter import Reporter

log = logging.getLogger("trainyard")

# transformers.trainer_utils.PREFIX_CHECKPOINT_DIR: the Trainer's checkpoint folders.
_CHECKPOINT_PREFIX = "checkpoint"


def _epoch(state: Any) -> int:
    # The Trainer counts fractional epochs; an epoch counts once it is complete.
    return int(math.floor(state.epoch or 0))


class TrainyardCallback(TrainerCallback):  # type: ignore[misc]
    def __init__(self, reporter: Optional[Reporter] = None) -> None:
        self.reporter = reporter if reporter is not None else Reporter()
        self._last_metrics: Mapping[str, Any] = {}

    def _report(self, args: Any, state: Any, metrics: Optional[Mapping[str, Any]]) -> None:
        if not state.is_world_process_zero or not metrics:
            return
        self._last_metrics = dict(metrics)
        total = int(math.ceil(args.num_train_epochs)) if args.num_train_epochs else None
        self.reporter.progress(
            _epoch(state), step=state.global_step, metrics=metrics, total_epochs=total
        )

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        self._report(args, state, logs)

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any
    ) -> None:
        self._report(args, state, metrics)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.reporter.stop_requested:
            control.should_training_stop = True
        if self.reporter.checkpoint_requested:
            control.should_save = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        directory = Path(args.output_dir) / f"{_CHECKPOINT_PREFIX}-{state.global_step}"
        try:
            saved = seal_checkpoint(
                directory, epoch=_epoch(state), step=state.global_step, metrics=self._last_metrics
            )
        except CheckpointError as error:
            # A save strategy writing elsewhere (a hub push only): nothing to seal.
            log.warning("trainyard: checkpoint not sealed: %s", error)
            return
        self.reporter.report_saved(saved)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.reporter.flush()
