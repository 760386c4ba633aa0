"""The callbacks driven the way each framework drives them, against stand-ins for the
frameworks' callback base classes and the objects their hooks receive (torch and
TensorFlow are too large to install in CI). The hook names and signatures are the
frameworks' documented ones; the Reporter behind them is real, against nats-server."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
from conftest import NatsServer, wait_for

from trainyard import Reporter, WorkerEnv, read_checkpoint


class _Base:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


@pytest.fixture
def frameworks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Stand-in base classes, under the import paths the callbacks use."""
    for name, module in {
        "lightning": _module("lightning"),
        "lightning.pytorch": _module("lightning.pytorch"),
        "lightning.pytorch.callbacks": _module("lightning.pytorch.callbacks", Callback=_Base),
        "transformers": _module("transformers", TrainerCallback=_Base),
        "keras": _module("keras"),
        "keras.callbacks": _module("keras.callbacks", Callback=_Base),
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    for name in ("lightning", "huggingface", "keras"):
        sys.modules.pop(f"trainyard.callbacks.{name}", None)
    yield
    for name in ("lightning", "huggingface", "keras"):
        sys.modules.pop(f"trainyard.callbacks.{name}", None)


def reporter_for(server: NatsServer, tmp_path: Path, **overrides: Any) -> Reporter:
    fields: Dict[str, Any] = dict(
        namespace="ml", job="cb", nats_url=server.url, checkpoint_dir=str(tmp_path),
        checkpoint_frequency=2,
    )
    fields.update(overrides)
    reporter = Reporter(WorkerEnv(**fields), gpu_metrics=False)
    assert reporter.wait_connected(10)
    return reporter


class Tensor:
    """What `trainer.callback_metrics` holds: 0-d tensors that convert with float()."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __float__(self) -> float:
        return self.value


class LightningTrainer:
    def __init__(self) -> None:
        self.current_epoch = 0
        self.global_step = 0
        self.max_epochs = 3
        self.callback_metrics: Dict[str, Tensor] = {}
        self.should_stop = False
        self.is_global_zero = True
        self.world_size = 1
        self.saved: list = []

    def save_checkpoint(self, filepath: str) -> None:
        Path(filepath).write_bytes(b"lightning state")
        self.saved.append(filepath)


def test_lightning_reports_epochs_saves_due_checkpoints_and_stops(
    frameworks: None, nats_server: NatsServer, tmp_path: Path
) -> None:
    callback_module = importlib.import_module("trainyard.callbacks.lightning")
    reporter = reporter_for(nats_server, tmp_path)
    callback = callback_module.TrainyardCallback(reporter)
    trainer = LightningTrainer()
    for epoch in range(2):
        trainer.current_epoch, trainer.global_step = epoch, (epoch + 1) * 50
        trainer.callback_metrics = {"train_loss": Tensor(1.0 / (epoch + 1)), "val_acc": Tensor(0.5)}
        callback.on_train_batch_end(trainer, None, None, None, 0)
        callback.on_train_epoch_end(trainer, None)
    nats_server.publish("trainyard.commands.stop.ml.cb", {"reason": "early stop"})
    assert wait_for(lambda: reporter.stop_requested)
    callback.on_train_batch_end(trainer, None, None, None, 0)
    assert trainer.should_stop
    callback.on_fit_end(trainer, None)
    reporter.close()

    reports = nats_server.stored_reports()
    progress = [r["payload"] for r in reports if r["type"] == "worker.progress"]
    assert [(p["epoch"], p["step"], p["totalEpochs"]) for p in progress] == [(1, 50, 3), (2, 100, 3)]
    assert progress[1]["metrics"] == {"train_loss": 0.5, "val_acc": 0.5}
    [checkpoint] = [r["payload"] for r in reports if r["type"] == "worker.checkpoint"]
    assert checkpoint["epoch"] == 2
    assert read_checkpoint(checkpoint["uri"]).files[0].path == "model.ckpt"


class TrainingArguments:
    def __init__(self, output_dir: Path) -> None:
        self.output_dir = str(output_dir)
        self.num_train_epochs = 3.0


class TrainerState:
    def __init__(self) -> None:
        self.epoch = 0.0
        self.global_step = 0
        self.is_world_process_zero = True


class TrainerControl:
    def __init__(self) -> None:
        self.should_training_stop = False
        self.should_save = False


def test_hugging_face_reports_logs_seals_saves_and_obeys_commands(
    frameworks: None, nats_server: NatsServer, tmp_path: Path
) -> None:
    callback_module = importlib.import_module("trainyard.callbacks.huggingface")
    reporter = reporter_for(nats_server, tmp_path)
    callback = callback_module.TrainyardCallback(reporter)
    args, state, control = TrainingArguments(tmp_path / "out"), TrainerState(), TrainerControl()

    state.epoch, state.global_step = 0.5, 10
    callback.on_log(args, state, control, logs={"loss": 0.9, "learning_rate": 5e-5})
    state.epoch, state.global_step = 1.0, 20
    callback.on_evaluate(args, state, control, metrics={"eval_loss": 0.7, "epoch": 1.0})

    nats_server.publish(
        "trainyard.commands.checkpoint-now.ml.cb",
        {"reason": "spot reclaim", "deadline": "2026-01-01T00:00:00Z"},
    )
    assert wait_for(lambda: reporter.checkpoint_requested)
    callback.on_step_end(args, state, control)
    assert control.should_save and not control.should_training_stop

    # The Trainer writes its checkpoint folder, then calls on_save.
    folder = tmp_path / "out" / "checkpoint-20"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    callback.on_save(args, state, control)
    assert not reporter.checkpoint_requested

    nats_server.publish("trainyard.commands.stop.ml.cb", {"reason": "user"})
    assert wait_for(lambda: reporter.stop_requested)
    callback.on_step_end(args, state, control)
    assert control.should_training_stop
    callback.on_train_end(args, state, control)
    reporter.close()

    reports = [(r["type"], r["payload"]) for r in nats_server.stored_reports()]
    assert [(t, p["epoch"], p["step"]) for t, p in reports] == [
        ("worker.progress", 0, 10),
        ("worker.progress", 1, 20),
        ("worker.checkpoint", 1, 20),
    ]
    assert reports[2][1]["uri"] == str(folder)
    assert reports[2][1]["metrics"] == {"eval_loss": 0.7, "epoch": 1.0}
    assert read_checkpoint(folder).files[0].path == "model.safetensors"


def test_hugging_face_reports_only_from_the_main_process(
    frameworks: None, nats_server: NatsServer, tmp_path: Path
) -> None:
    callback_module = importlib.import_module("trainyard.callbacks.huggingface")
    reporter = reporter_for(nats_server, tmp_path)
    callback = callback_module.TrainyardCallback(reporter)
    state = TrainerState()
    state.is_world_process_zero = False
    callback.on_log(TrainingArguments(tmp_path), state, TrainerControl(), logs={"loss": 1.0})
    callback.on_save(TrainingArguments(tmp_path), state, TrainerControl())
    reporter.close()
    assert nats_server.stored_reports() == []


class KerasModel:
    def __init__(self) -> None:
        self.stop_training = False

    def save(self, filepath: str) -> None:
        # Keras 3 refuses a path that does not end in .keras.
        assert filepath.endswith(".keras"), filepath
        Path(filepath).write_bytes(b"keras zip")


def test_keras_reports_epochs_from_one_saves_due_checkpoints_and_stops(
    frameworks: None, nats_server: NatsServer, tmp_path: Path
) -> None:
    callback_module = importlib.import_module("trainyard.callbacks.keras")
    reporter = reporter_for(nats_server, tmp_path)
    callback = callback_module.TrainyardCallback(reporter)
    callback.model = KerasModel()  # what Callback.set_model does
    callback.params = {"epochs": 4, "steps": 5, "verbose": 0}
    for epoch in range(2):
        for batch in range(5):
            callback.on_train_batch_end(batch, {"loss": 1.0})
        callback.on_epoch_end(epoch, {"loss": 1.0 / (epoch + 1), "val_loss": float("nan")})
    nats_server.publish("trainyard.commands.stop.ml.cb", {"reason": "early stop"})
    assert wait_for(lambda: reporter.stop_requested)
    callback.on_train_batch_end(0, {})
    assert callback.model.stop_training
    callback.on_train_end()
    reporter.close()

    reports = [(r["type"], r["payload"]) for r in nats_server.stored_reports()]
    assert [(t, p["epoch"], p["step"]) for t, p in reports] == [
        ("worker.progress", 1, 5),
        ("worker.progress", 2, 10),
        ("worker.checkpoint", 2, 10),
    ]
    assert reports[0][1]["metrics"] == {"loss": 1.0}
    assert reports[0][1]["totalEpochs"] == 4
    assert read_checkpoint(reports[2][1]["uri"]).files[0].path == "model.keras"
