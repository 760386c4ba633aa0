#!/usr/bin/env python3
"""A small training script that reports to Trainyard with the `trainyard` library.

It fits y = 3x + 2 by gradient descent (no GPU, no ML framework needed) and shows
the whole worker contract, which any framework follows the same way:

- progress: `reporter.progress(epoch, metrics=...)` after each epoch;
- checkpoints: when `reporter.checkpoint_due(epoch)` (every CHECKPOINT_FREQUENCY
  epochs, or at once on a checkpoint-now command), saved atomically with its
  manifest into CHECKPOINT_DIR and reported;
- resume: start from RESUME_FROM when set, after checking it against its manifest;
- stop: end at the next epoch once `reporter.stop_requested`.

The planner sets every variable read here; `pip install ./sdk/python` installs the
library (it needs nats-py).
"""

import json
import os
import random
import time

import trainyard


def main() -> None:
    epoch_seconds = float(os.environ.get("TRAINYARD_EPOCH_SECONDS", "0"))
    with trainyard.Reporter() as reporter:
        env = reporter.env
        epochs = env.epochs or 10
        learning_rate = env.learning_rate or 0.05
        batch_size = env.batch_size or 32

        rng = random.Random(env.worker_index)
        w, b, start_epoch, step = 0.0, 0.0, 0, 0
        if reporter.resume_from:
            checkpoint = trainyard.read_checkpoint(reporter.resume_from)
            state = json.loads(checkpoint.path("state.json").read_text())
            w, b, start_epoch, step = state["w"], state["b"], checkpoint.epoch, checkpoint.step

        for epoch in range(start_epoch + 1, epochs + 1):
            loss = 0.0
            for _ in range(batch_size):
                x = rng.uniform(-1, 1)
                err = (w * x + b) - (3 * x + 2)
                w -= learning_rate * err * x
                b -= learning_rate * err
                loss += err * err / batch_size
                step += 1
            metrics = {"loss": round(loss, 6), "accuracy": round(max(0.0, 1.0 - loss), 6)}
            reporter.progress(epoch, step=step, metrics=metrics)
            if reporter.checkpoint_due(epoch):
                with reporter.checkpoint(epoch, step=step, metrics=metrics) as ckpt:
                    ckpt.write_json("state.json", {"w": w, "b": b})
            if epoch_seconds:
                time.sleep(epoch_seconds)
            if reporter.stop_requested:
                break


if __name__ == "__main__":
    main()
