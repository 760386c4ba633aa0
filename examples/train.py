#!/usr/bin/env python3
"""A small training script that reports to Trainyard over NATS.

It fits y = 3x + 2 by gradient descent (no GPU, no ML framework needed) and shows
the whole worker contract, which any framework can follow:

- progress: publish a `worker.progress` envelope on
  `trainyard.worker.progress.<namespace>.<job>` after each epoch;
- checkpoints: write one to CHECKPOINT_DIR every CHECKPOINT_FREQUENCY epochs
  atomically (a temporary directory, `trainyard-manifest.json` written last,
  then renamed), check it against its manifest, and publish `worker.checkpoint`
  on `trainyard.worker.checkpoint.<namespace>.<job>` with how it was verified
  and how long the save took; with CHECKPOINT_FREQUENCY=auto, save at the
  interval the checkpoint-manager advises (`checkpoint.interval`);
- retention: delete the checkpoints a `checkpoint.retention` decision with
  executor `worker` names (volumes the checkpoint-manager cannot read);
- resume: start from RESUME_FROM (a checkpoint directory) when set;
- commands: stop on `command.stop`, checkpoint at once on `command.checkpoint-now`
  (subjects `trainyard.commands.<kind>.<namespace>.<job>`).

The planner sets every variable read here. Subject tokens: a `.` in a name is
written `_`. Payload schemas: docs/messages.md.
"""

import asyncio
import hashlib
import json
import os
import random
import secrets
import shutil
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

    async def checkpoint(self, epoch: int, step: int, uri: str, size: int, metrics: dict,
                         save_seconds: float):
        await self.publish("checkpoint", "worker.checkpoint", {
            "workerIndex": self.index, "attempt": self.attempt, "epoch": epoch,
            "step": step, "uri": uri, "sizeBytes": size, "metrics": metrics,
            "saveSeconds": round(save_seconds, 6),
            "verifiedBy": "trainyard-manifest", "checksumsVerified": True,
        })


MANIFEST = "trainyard-manifest.json"
STATE_FILE = "state.json"


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_durably(path: str, data: bytes):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(directory: str, epoch: int, step: int, state: dict, metrics: dict) -> tuple[str, int]:
    """Writes a checkpoint directory atomically: files, then the manifest
    (Trainyard's completion marker, always last), then one rename."""
    final = os.path.join(directory, f"checkpoint-epoch-{epoch}")
    temporary = os.path.join(directory, f".checkpoint-epoch-{epoch}.tmp-{secrets.token_hex(4)}")
    os.makedirs(temporary)
    write_durably(os.path.join(temporary, STATE_FILE), json.dumps(state).encode())
    files = [{"path": STATE_FILE,
              "sizeBytes": os.path.getsize(os.path.join(temporary, STATE_FILE)),
              "sha256": sha256_of(os.path.join(temporary, STATE_FILE))}]
    manifest = {"format": "trainyard.checkpoint/v1", "step": step, "epoch": epoch,
                "createdAt": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
                "files": files, "metrics": metrics}
    write_durably(os.path.join(temporary, MANIFEST), json.dumps(manifest).encode())
    if os.path.exists(final):
        shutil.rmtree(final)
    os.rename(temporary, final)
    return final, sum(f["sizeBytes"] for f in files)


def verify_checkpoint(path: str) -> bool:
    """True when every file the manifest lists is there with its size and SHA-256."""
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            manifest = json.load(f)
        return manifest.get("format") == "trainyard.checkpoint/v1" and all(
            os.path.getsize(os.path.join(path, entry["path"])) == entry["sizeBytes"]
            and sha256_of(os.path.join(path, entry["path"])) == entry["sha256"]
            for entry in manifest["files"])
    except (OSError, ValueError, KeyError):
        return False


def load_checkpoint(path: str) -> dict | None:
    if not path or not os.path.exists(path):
        return None
    state = os.path.join(path, STATE_FILE) if os.path.isdir(path) else path
    with open(state) as f:
        return json.load(f)


def inside(directory: str, path: str) -> bool:
    directory = os.path.realpath(directory)
    return os.path.realpath(path).startswith(directory + os.sep)


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
    frequency = env.get("CHECKPOINT_FREQUENCY", "1")
    auto_interval = frequency == "auto"
    checkpoint_every = 1 if auto_interval else int(frequency)
    advised_seconds = [None]
    last_save = [time.monotonic()]
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

    async def on_retention(msg):
        payload = json.loads(msg.data)["payload"]
        if payload.get("executor") != "worker" or index != 0:
            return
        for path in payload.get("delete", []):
            # Only inside this job's checkpoint directory.
            if checkpoint_dir and inside(checkpoint_dir, path) and os.path.isdir(path):
                shutil.rmtree(path)

    async def on_interval(msg):
        advised_seconds[0] = json.loads(msg.data)["payload"]["intervalSeconds"]

    decisions = f"{SUBJECT_ROOT}.decisions.{{}}.{token(namespace)}.{token(job)}"
    await nc.subscribe(decisions.format("retention"), cb=on_retention)
    await nc.subscribe(decisions.format("interval"), cb=on_interval)

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
        if auto_interval and advised_seconds[0] is not None:
            on_schedule = time.monotonic() - last_save[0] >= advised_seconds[0]
        else:
            on_schedule = epoch % checkpoint_every == 0
        due = checkpoint_dir and (on_schedule or checkpoint_now.is_set())
        if due and index == 0:
            started = time.monotonic()
            path, size = save_checkpoint(checkpoint_dir, epoch, step,
                                         {"w": w, "b": b, "epoch": epoch, "step": step}, metrics)
            if verify_checkpoint(path):
                await reporter.checkpoint(epoch, step, path, size, metrics, time.monotonic() - started)
            last_save[0] = time.monotonic()
            checkpoint_now.clear()
        if epoch_seconds:
            await asyncio.sleep(epoch_seconds)
        if stop.is_set():
            break

    await nc.drain()


if __name__ == "__main__":
    asyncio.run(main())
