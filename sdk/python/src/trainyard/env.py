"""The worker's environment, as the planner sets it on every worker container."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Mapping, Optional

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
HYPERPARAMETER_PREFIX = "HP_"


class EnvError(ValueError):
    """A variable the planner sets holds a value that cannot be read."""


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not an integer") from None


def _float(environ: Mapping[str, str], name: str) -> Optional[float]:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not a number") from None


def _text(environ: Mapping[str, str], name: str) -> Optional[str]:
    raw = environ.get(name, "").strip()
    return raw or None


@dataclass(frozen=True)
class WorkerEnv:
    """Who this worker is and where it reports.

    Outside a Trainyard pod every field falls back to a default that works
    against a local nats-server (`default/local`, rank 0 of 1).
    """

    namespace: str = "default"
    job: str = "local"
    attempt: int = 0
    worker_index: int = 0
    num_workers: int = 1
    nats_url: str = DEFAULT_NATS_URL
    #: The job's NATS token (`TRAINYARD_NATS_TOKEN`, from the planner's Secret):
    #: connect with it when set; NATS then lets this worker report for its own
    #: job only.
    nats_token: Optional[str] = None
    #: The CA bundle the NATS server's certificate is verified with
    #: (`TRAINYARD_NATS_CA_FILE`, the installation's CA from the same Secret),
    #: for a `tls://` URL; unset, the system's trusted CAs.
    nats_ca_file: Optional[str] = None
    epochs: Optional[int] = None
    learning_rate: Optional[float] = None
    batch_size: Optional[int] = None
    checkpoint_dir: Optional[str] = None
    checkpoint_frequency: int = 1
    #: `CHECKPOINT_FREQUENCY=auto` (`checkpoint.frequency: auto`): save at the
    #: interval the checkpoint-manager advises, every epoch until there is advice.
    checkpoint_auto: bool = False
    #: The advised seconds between saves when the container started
    #: (`CHECKPOINT_INTERVAL_SECONDS`); later advice arrives as a command.
    checkpoint_interval_seconds: Optional[float] = None
    resume_from: Optional[str] = None
    mlflow_tracking_uri: Optional[str] = None
    mlflow_run_id: Optional[str] = None
    #: Where to write TensorBoard event files (`spec.monitoring.tensorboardEnabled`
    #: with checkpointing on): `tensorboard` under the checkpoint directory.
    tensorboard_log_dir: Optional[str] = None
    #: `spec.hyperparameters.additionalParams`, keyed by their variable name
    #: without the `HP_` prefix, lower-cased (`HP_WEIGHT_DECAY` → `weight_decay`).
    hyperparameters: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_chief(self) -> bool:
        """Rank 0: the worker whose metrics count and who writes checkpoints."""
        return self.worker_index == 0

    @classmethod
    def from_environ(cls, environ: Optional[Mapping[str, str]] = None) -> "WorkerEnv":
        env = os.environ if environ is None else environ
        epochs = _int(env, "EPOCHS", 0)
        batch_size = _int(env, "BATCH_SIZE", 0)
        checkpoint_auto = _text(env, "CHECKPOINT_FREQUENCY") == "auto"
        interval = _float(env, "CHECKPOINT_INTERVAL_SECONDS")
        return cls(
            namespace=_text(env, "TRAINYARD_NAMESPACE") or "default",
            job=_text(env, "TRAINYARD_JOB") or "local",
            attempt=_int(env, "TRAINYARD_ATTEMPT", 0),
            worker_index=_int(env, "TRAINYARD_WORKER_INDEX", 0),
            num_workers=_int(env, "TRAINYARD_NUM_WORKERS", 1),
            nats_url=_text(env, "TRAINYARD_NATS_URL") or DEFAULT_NATS_URL,
            nats_token=_text(env, "TRAINYARD_NATS_TOKEN"),
            nats_ca_file=_text(env, "TRAINYARD_NATS_CA_FILE"),
            epochs=epochs or None,
            learning_rate=_float(env, "LEARNING_RATE"),
            batch_size=batch_size or None,
            checkpoint_dir=_text(env, "CHECKPOINT_DIR"),
            checkpoint_frequency=1
            if checkpoint_auto
            else max(1, _int(env, "CHECKPOINT_FREQUENCY", 1)),
            checkpoint_auto=checkpoint_auto,
            checkpoint_interval_seconds=interval
            if interval is not None and math.isfinite(interval) and interval > 0
            else None,
            resume_from=_text(env, "RESUME_FROM"),
            mlflow_tracking_uri=_text(env, "MLFLOW_TRACKING_URI"),
            mlflow_run_id=_text(env, "MLFLOW_RUN_ID"),
            tensorboard_log_dir=_text(env, "TENSORBOARD_LOG_DIR"),
            hyperparameters={
                name[len(HYPERPARAMETER_PREFIX) :].lower(): value
                for name, value in env.items()
                if name.startswith(HYPERPARAMETER_PREFIX)
            },
        )
