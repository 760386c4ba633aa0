"""PyTorch Lightning: `Trainer(callbacks=[TrainyardCallback()])`.

Reports each training epoch's `trainer.callback_metrics` (validation metrics
included: Lightning validates before `on_train_epoch_end`), stops the trainer on a
stop command, and, in a single-process run, saves `trainer.save_checkpoint` into a
manifest-sealed checkpoint when one is due. Multi-process runs keep Lightning's
`ModelCheckpoint` and report its files with `Reporter.report_saved(seal_checkpoint(...))`:
Lightning's save is a collective call every rank must make at the same step, and a
checkpoint-now command does not reach every rank at the same step.
"""

from __future__ import annotations

from typing import Any, Optional

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the package's older name
    from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef]

from ..reporter import Reporter


class TrainyardCallback(Callback):  # type: ignore[misc]
    def __init__(self, reporter: Optional[Reporter] = None, *, checkpoints: bool = True) -> None:
        super().__init__()
        self.reporter = reporter if reporter is not None else Reporter()
        self.checkpoints = checkpoints

    def on_train_batch_end(self, trainer: Any, *_: Any, **__: Any) -> None:
        if self.reporter.stop_requested:
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        epoch = trainer.current_epoch + 1
        metrics = dict(trainer.callback_metrics)
        total = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
        if trainer.is_global_zero:
            self.reporter.progress(epoch, step=trainer.global_step, metrics=metrics, total_epochs=total)
        if self.checkpoints and trainer.world_size == 1 and self.reporter.checkpoint_due(epoch):
            with self.reporter.checkpoint(epoch, step=trainer.global_step, metrics=metrics) as ckpt:
                trainer.save_checkpoint(str(ckpt.file("model.ckpt")))
        if self.reporter.stop_requested:
            trainer.should_stop = True

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.reporter.flush()
