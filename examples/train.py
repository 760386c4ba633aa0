#!/usr/bin/env python3
"""A small training script that reports to Trainyard over NATS.

It fits y = 3x + 2 by gradient descent (no GPU, no ML framework needed) and shows
the whole worker contract, which any framework can follow:

- progress: publish a `worker.progress` envelope on
  `trainyard.worker.progress.<namespace>.<job>` after each epoch;
- checkpoints: write one to CHECKPOINT_DIR every CHECKPOINT_FREQUENCY epochs and
  publish `worker.checkpoint` on `trainyard.worker.checkpoint.<namespace>.<job>`;
- resume: start from RESUME_FROM when set;
- commands: stop on `command.stop`, checkpoint at once on `command.checkpoint-now`
  (subjects `trainyard.commands.<kind>.<namespace>.<job>`).

The planner sets every variable read here. Subject tokens: a `.` in a name is
written `_`. Payload schemas: docs/messages.md.
"""

import asyncio
import json
import os
import random
import secrets
import time
from datetime import datetime, timezone

import nats

SUBJECT_ROOT = "trainyard"


def token(name: str) -> str:
    return name.replace(".", "_")


def uuid7() -> str:
    """A UUID v7 (time-ordered), as envelopes require."""
    ms = int(time.time() * 1000)
    raw = bytearray(ms.to_bytes(6, "big") + secrets.token_bytes(10))
    raw[6] = (raw[6] & 0x0F) | 0x70
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Reporter:
    def __init__(self, nc, js, namespace: str, job: str, attempt: int, index: int):
        self.nc, self.js = nc, js
        self.namespace, self.job, self.attempt, self.index = namespace, job, attempt, index

    def envelope(self, message_type: str, payload: dict) -> tuple[str, bytes]:
        message_id = uuid7()
        body = {
            "id": message_id,
            "type": message_type,
            "schemaVersion": 1,
            "source": f"worker-{self.index}",
            "time": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
            "entity": {"namespace": self.namespace, "name": self.job, "uid": ""},
            "correlationId": message_id,
            "payload": payload,
        }
        return message_id, json.dumps(body).encode()

    async def publish(self, kind: str, message_type: str, payload: dict):
        subject = f"{SUBJECT_ROOT}.worker.{kind}.{token(self.namespace)}.{token(self.job)}"
        message_id, body = self.envelope(message_type, payload)
        # JetStream drops a repeated Nats-Msg-Id, so a retried publish is stored once.
        await self.js.publish(subject, body, headers={"Nats-Msg-Id": message_id})

    async def progress(self, epoch: int, total: int, step: int, metrics: dict):
        await self.publish("progress", "worker.progress", {
            "workerIndex": self.index, "attempt": self.attempt, "epoch": epoch,
            "totalEpochs": total, "step": step, "metrics": metrics,
        })

    async def checkpoint(self, epoch: int, step: int, uri: str, size: int, metrics: dict):
        await self.publish("checkpoint", "worker.checkpoint", {
            "workerIndex": self.index, "attempt": self.attempt, "epoch": epoch,
            "step": step, "uri": uri, "sizeBytes": size, "metrics": metrics,
        })


def save_checkpoint(directory: str, epoch: int, state: dict) -> tuple[str, int]:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"checkpoint-epoch-{epoch}.json")
    data = json.dumps(state).encode()
    with open(path, "wb") as f:
        f.write(data)
    return path, len(data)


def load_checkpoint(path: str) -> dict | None:
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


async def main():
    env = os.environ
    namespace = env.get("TRAINYARD_NAMESPACE", "default")
    job = env.get("TRAINYARD_JOB", "local")
    attempt = int(env.get("TRAINYARD_ATTEMPT", "0"))
    index = int(env.get("TRAINYARD_WORKER_INDEX", "0"))
    epochs = int(env.get("EPOCHS", "10"))
    learning_rate = float(env.get("LEARNING_RATE", "0.05"))
    batch_size = int(env.get("BATCH_SIZE", "32"))
    checkpoint_dir = env.get("CHECKPOINT_DIR", "")
    checkpoint_every = int(env.get("CHECKPOINT_FREQUENCY", "1"))
    epoch_seconds = float(env.get("TRAINYARD_EPOCH_SECONDS", "0"))

    nc = await nats.connect(env.get("TRAINYARD_NATS_URL", "nats://127.0.0.1:4222"))
    js = nc.jetstream()
    reporter = Reporter(nc, js, namespace, job, attempt, index)

    stop = asyncio.Event()
    checkpoint_now = asyncio.Event()

    async def on_command(msg):
        kind = msg.subject.split(".")[2]
        if kind == "stop":
            stop.set()
        elif kind == "checkpoint-now":
            checkpoint_now.set()

    await nc.subscribe(f"{SUBJECT_ROOT}.commands.*.{token(namespace)}.{token(job)}", cb=on_command)

    rng = random.Random(index)
    w, b, start_epoch, step = 0.0, 0.0, 0, 0
    resumed = load_checkpoint(env.get("RESUME_FROM", ""))
    if resumed:
        w, b, start_epoch, step = resumed["w"], resumed["b"], resumed["epoch"], resumed["step"]

    for epoch in range(start_epoch + 1, epochs + 1):
        loss = 0.0
        for _ in range(batch_size):
            x = rng.uniform(-1, 1)
            y = 3 * x + 2
            err = (w * x + b) - y
            w -= learning_rate * err * x
            b -= learning_rate * err
            loss += err * err / batch_size
            step += 1
        accuracy = max(0.0, 1.0 - loss)
        metrics = {"loss": round(loss, 6), "accuracy": round(accuracy, 6)}
        await reporter.progress(epoch, epochs, step, metrics)
        due = checkpoint_dir and (epoch % checkpoint_every == 0 or checkpoint_now.is_set())
        if due and index == 0:
            path, size = save_checkpoint(checkpoint_dir, epoch, {"w": w, "b": b, "epoch": epoch, "step": step})
            await reporter.checkpoint(epoch, step, path, size, metrics)
            checkpoint_now.clear()
        if epoch_seconds:
            await asyncio.sleep(epoch_seconds)
        if stop.is_set():
            break

    await nc.drain()


if __name__ == "__main__":
    asyncio.run(main())
