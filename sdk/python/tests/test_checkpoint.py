from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainyard import (
    MANIFEST_FILE,
    CheckpointError,
    CheckpointWriter,
    read_checkpoint,
    seal_checkpoint,
)


def test_an_interrupted_save_leaves_no_manifest_and_no_temporary_files(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoint-epoch-1"
    with pytest.raises(RuntimeError):
        with CheckpointWriter(directory, epoch=1) as ckpt:
            ckpt.write_bytes("model.bin", b"partial")
            raise RuntimeError("killed mid-save")
    assert list(directory.iterdir()) == []
    with pytest.raises(CheckpointError, match="did not finish"):
        read_checkpoint(directory)


def test_files_are_renamed_into_place_before_the_manifest_is_written(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoint-epoch-1"
    with CheckpointWriter(directory, epoch=1, step=10) as ckpt:
        temp = ckpt.file("model.keras")
        temp.write_bytes(b"weights")
        # While the save runs: the file sits under a temporary name, keeping its
        # extension for savers that check it, and there is no manifest.
        assert temp.name.endswith(".keras") and temp.name != "model.keras"
        assert not (directory / "model.keras").exists()
        assert not (directory / MANIFEST_FILE).exists()
    assert sorted(p.name for p in directory.iterdir()) == ["model.keras", MANIFEST_FILE]
    assert ckpt.saved.files[0].size_bytes == len(b"weights")


def test_a_file_changed_after_the_save_fails_verification(tmp_path: Path) -> None:
    directory = tmp_path / "c"
    with CheckpointWriter(directory, epoch=1) as ckpt:
        ckpt.write_bytes("a.bin", b"0123")
    (directory / "a.bin").write_bytes(b"4567")
    with pytest.raises(CheckpointError, match="SHA-256"):
        read_checkpoint(directory)
    (directory / "a.bin").write_bytes(b"45")
    with pytest.raises(CheckpointError, match="2 bytes"):
        read_checkpoint(directory)
    assert read_checkpoint(directory, verify=False).epoch == 1


def test_a_new_save_over_an_old_one_removes_the_old_manifest_first(tmp_path: Path) -> None:
    directory = tmp_path / "c"
    with CheckpointWriter(directory, epoch=1) as ckpt:
        ckpt.write_bytes("a.bin", b"old")
    with pytest.raises(RuntimeError):
        with CheckpointWriter(directory, epoch=1) as ckpt:
            raise RuntimeError("crash")
    assert not (directory / MANIFEST_FILE).exists()


def test_seal_lists_every_file_a_framework_wrote(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoint-500"
    (directory / "sub").mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(b"x" * 10)
    (directory / "sub" / "trainer_state.json").write_text("{}")
    saved = seal_checkpoint(directory, epoch=2, step=500, metrics={"eval_loss": 0.3})
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    assert [f["path"] for f in manifest["files"]] == ["model.safetensors", "sub/trainer_state.json"]
    assert manifest["metrics"] == {"eval_loss": 0.3}
    assert saved.step == 500 and read_checkpoint(directory).step == 500


@pytest.mark.parametrize("name", ["../escape.bin", "/abs.bin", MANIFEST_FILE])
def test_file_names_outside_the_checkpoint_or_the_manifest_are_refused(
    tmp_path: Path, name: str
) -> None:
    with pytest.raises(CheckpointError):
        with CheckpointWriter(tmp_path / "c", epoch=1) as ckpt:
            ckpt.file(name)


def test_an_object_store_directory_names_the_way_to_report_it() -> None:
    with pytest.raises(CheckpointError, match="report_checkpoint"):
        CheckpointWriter("s3://bucket/ml/job", epoch=1)
