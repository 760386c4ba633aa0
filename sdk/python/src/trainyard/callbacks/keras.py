"""Keras: `model.fit(..., callbacks=[TrainyardCallback()])`.

Reports each epoch's `logs`, stops training on a stop command, and, in a
single-worker run, saves the model (`model.keras`) into a manifest-sealed checkpoint
when one is due. Multi-worker strategies save collectively on every worker: keep
Keras' `ModelCheckpoint` there and report with `Reporter.report_saved(seal_checkpoint(...))`.
"""

from __future__ import annotations

from typing import Any, Optional

try:
    from keras.callbacks import Callback
except ImportError:  # TensorFlow's bundled Keras
    from tensorflow.keras.callbacks import Callback  # type: ignore[no-redef]

from ..reporter import Reporter


class TrainyardCallback(Callback):  # type: ignore[misc]
    def __init__(self, reporter: Optional[Reporter] = None, *, checkpoints: bool = True) -> None:
        super().__init__()
        self.reporter = reporter if reporter is not None else Reporter()
        self.checkpoints = checkpoints
        self._step = 0

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._step += 1
        if self.reporter.stop_requested:
            self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        done = epoch + 1  # Keras counts epochs from 0
        total = (self.params or {}).get("epochs")
        self.reporter.progress(done, step=self._step, metrics=logs or {}, total_epochs=total)
        single_worker = self.reporter.env.num_workers == 1
        if self.checkpoints and single_worker and self.reporter.checkpoint_due(done):
            with self.reporter.checkpoint(done, step=self._step, metrics=logs or {}) as ckpt:
                self.model.save(str(ckpt.file("model.keras")))
        if self.reporter.stop_requested:
            self.model.stop_training = True

    def on_train_end(self, logs: Any = None) -> None:
        self.reporter.flush()
