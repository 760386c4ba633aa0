from __future__ import annotations

import pytest

from trainyard import EnvError, WorkerEnv


def test_the_planners_variables_are_read() -> None:
    env = WorkerEnv.from_environ(
        {
            "TRAINYARD_NAMESPACE": "ml",
            "TRAINYARD_JOB": "bert",
            "TRAINYARD_ATTEMPT": "3",
            "TRAINYARD_WORKER_INDEX": "1",
            "TRAINYARD_NUM_WORKERS": "4",
            "TRAINYARD_NATS_URL": "nats://nats.trainyard:4222",
            "TRAINYARD_NATS_TOKEN": "signed-token",
            "TRAINYARD_NATS_CA_FILE": "/etc/trainyard/nats-ca.crt",
            "EPOCHS": "10",
            "LEARNING_RATE": "0.00001",
            "BATCH_SIZE": "64",
            "CHECKPOINT_DIR": "/checkpoints",
            "CHECKPOINT_FREQUENCY": "2",
            "RESUME_FROM": "/checkpoints/checkpoint-epoch-4",
            "MLFLOW_TRACKING_URI": "http://mlflow:5000",
            "MLFLOW_RUN_ID": "abc123",
            "TENSORBOARD_LOG_DIR": "/checkpoints/tensorboard",
            "HP_WEIGHT_DECAY": "0.01",
        }
    )
    assert (env.namespace, env.job, env.attempt, env.worker_index, env.num_workers) == (
        "ml",
        "bert",
        3,
        1,
        4,
    )
    assert not env.is_chief
    assert (env.epochs, env.learning_rate, env.batch_size) == (10, 1e-5, 64)
    assert (env.checkpoint_dir, env.checkpoint_frequency) == ("/checkpoints", 2)
    assert env.resume_from == "/checkpoints/checkpoint-epoch-4"
    assert (env.mlflow_tracking_uri, env.mlflow_run_id) == ("http://mlflow:5000", "abc123")
    assert env.tensorboard_log_dir == "/checkpoints/tensorboard"
    assert env.hyperparameters == {"weight_decay": "0.01"}
    assert env.nats_token == "signed-token"
    assert env.nats_ca_file == "/etc/trainyard/nats-ca.crt"


def test_frequency_auto_and_the_advised_interval_are_read() -> None:
    env = WorkerEnv.from_environ(
        {"CHECKPOINT_FREQUENCY": "auto", "CHECKPOINT_INTERVAL_SECONDS": "1800.5"}
    )
    assert (env.checkpoint_auto, env.checkpoint_frequency) == (True, 1)
    assert env.checkpoint_interval_seconds == 1800.5
    fixed = WorkerEnv.from_environ({"CHECKPOINT_FREQUENCY": "3"})
    assert (fixed.checkpoint_auto, fixed.checkpoint_frequency) == (False, 3)
    assert fixed.checkpoint_interval_seconds is None


def test_outside_trainyard_the_defaults_reach_a_local_nats() -> None:
    env = WorkerEnv.from_environ({"RESUME_FROM": ""})
    assert (env.namespace, env.job, env.worker_index, env.is_chief) == ("default", "local", 0, True)
    assert env.nats_url == "nats://127.0.0.1:4222"
    assert env.resume_from is None and env.epochs is None
    assert env.tensorboard_log_dir is None
    assert env.nats_token is None
    assert env.nats_ca_file is None


def test_a_malformed_number_names_the_variable() -> None:
    with pytest.raises(EnvError, match="TRAINYARD_ATTEMPT='x'"):
        WorkerEnv.from_environ({"TRAINYARD_ATTEMPT": "x"})
