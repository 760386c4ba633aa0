"""Checkpoints that are either complete or absent.

A checkpoint is a directory. Each file is written under a temporary name and
renamed into place once flushed to disk; the manifest `trainyard-manifest.json`,
which lists every file with its size and SHA-256, is written last (the same way).
A directory without a manifest is an interrupted save and is never resumed from;
the checkpoint-manager verifies the manifest before it offers a checkpoint for
resume.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any, Dict, List, Mapping, Optional, Type, Union

from .messages import finite_metrics

MANIFEST_FILE = "trainyard-manifest.json"
MANIFEST_FORMAT = "trainyard.checkpoint/v1"
# A prefix, not a suffix: some savers insist on their extension (Keras: `.keras`).
_TEMP_PREFIX = ".trainyard-tmp."
_CHUNK = 1 << 20


class CheckpointError(Exception):
    """A checkpoint could not be written or does not match its manifest."""


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class SavedCheckpoint:
    """A checkpoint whose manifest is on disk."""

    uri: str
    epoch: int
    step: int
    size_bytes: int
    #: SHA-256 of the manifest file: it covers every file's digest.
    sha256: str
    save_seconds: float
    files: List[ManifestFile]
    metrics: Dict[str, float] = field(default_factory=dict)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(directory: Path) -> None:
    # A rename is durable once the directory entry is; not every platform can open
    # a directory (Windows), and there the rename is as durable as it gets.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(target: Path, data: bytes) -> None:
    temp = target.with_name(_TEMP_PREFIX + target.name)
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, target)
    _fsync_dir(target.parent)


def _local_directory(directory: Union[str, os.PathLike]) -> Path:
    text = os.fspath(directory)
    if "://" in text:
        raise CheckpointError(
            f"checkpoint directory {text!r} is an object-store URI: save it with your "
            "storage client and report it with Reporter.report_checkpoint(uri, ...)"
        )
    return Path(text)


class CheckpointWriter:
    """Writes one checkpoint directory; use it as a context manager.

    ```python
    with CheckpointWriter("/checkpoints/checkpoint-epoch-3", epoch=3, step=300) as ckpt:
        torch.save(model.state_dict(), ckpt.file("model.pt"))
        ckpt.write_bytes("optimizer.bin", blob)
    saved = ckpt.saved
    ```

    `file()` returns a temporary path to write to; on a clean exit every file is
    flushed and renamed to its name, then the manifest is written. When the block
    raises, the temporary files are removed and no manifest is written.
    """

    def __init__(
        self,
        directory: Union[str, os.PathLike],
        *,
        epoch: int,
        step: int = 0,
        metrics: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.directory = _local_directory(directory)
        self.epoch = int(epoch)
        self.step = int(step)
        self.metrics, _ = finite_metrics(metrics)
        self._pending: Dict[str, Path] = {}
        self._started = 0.0
        self._saved: Optional[SavedCheckpoint] = None

    @property
    def saved(self) -> SavedCheckpoint:
        if self._saved is None:
            raise CheckpointError("the checkpoint is saved when its `with` block ends")
        return self._saved

    def file(self, relative: str) -> Path:
        """A temporary path for `relative` (which may contain directories)."""
        rel = Path(relative)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise CheckpointError(
                f"checkpoint file {relative!r} must be a relative path inside the checkpoint"
            )
        if rel.as_posix() == MANIFEST_FILE:
            raise CheckpointError(f"{MANIFEST_FILE} is written by the library")
        target = self.directory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(_TEMP_PREFIX + target.name)
        self._pending[rel.as_posix()] = temp
        return temp

    def write_bytes(self, relative: str, data: bytes) -> None:
        with open(self.file(relative), "wb") as f:
            f.write(data)

    def write_json(self, relative: str, value: Any) -> None:
        self.write_bytes(relative, json.dumps(value).encode())

    def __enter__(self) -> "CheckpointWriter":
        self._started = time.monotonic()
        self.directory.mkdir(parents=True, exist_ok=True)
        # A manifest left by an earlier attempt at this epoch would vouch for files
        # about to be replaced.
        (self.directory / MANIFEST_FILE).unlink(missing_ok=True)
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if exc_type is not None:
            for temp in self._pending.values():
                temp.unlink(missing_ok=True)
            return
        if not self._pending:
            raise CheckpointError("a checkpoint needs at least one file")
        files = []
        for rel, temp in sorted(self._pending.items()):
            if not temp.exists():
                raise CheckpointError(f"checkpoint file {rel!r} was never written")
            with open(temp, "rb+") as f:
                os.fsync(f.fileno())
            target = self.directory / rel
            os.replace(temp, target)
            _fsync_dir(target.parent)
            files.append(ManifestFile(rel, target.stat().st_size, _sha256(target)))
        self._saved = _write_manifest(
            self.directory, self.epoch, self.step, self.metrics, files, self._started
        )


def _write_manifest(
    directory: Path,
    epoch: int,
    step: int,
    metrics: Dict[str, float],
    files: List[ManifestFile],
    started: float,
) -> SavedCheckpoint:
    manifest = {
        "format": MANIFEST_FORMAT,
        "step": step,
        "epoch": epoch,
        "createdAt": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
        "files": [{"path": f.path, "sizeBytes": f.size_bytes, "sha256": f.sha256} for f in files],
        "metrics": metrics,
    }
    data = json.dumps(manifest, indent=2, allow_nan=False).encode()
    _atomic_write(directory / MANIFEST_FILE, data)
    return SavedCheckpoint(
        uri=str(directory),
        epoch=epoch,
        step=step,
        size_bytes=sum(f.size_bytes for f in files) + len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        save_seconds=time.monotonic() - started,
        files=files,
        metrics=metrics,
    )


def seal_checkpoint(
    directory: Union[str, os.PathLike],
    *,
    epoch: int,
    step: int = 0,
    metrics: Optional[Mapping[str, Any]] = None,
) -> SavedCheckpoint:
    """Writes the manifest of a checkpoint directory a framework has already written
    (a Hugging Face `checkpoint-<step>`, a Lightning `.ckpt` directory): every file in it
    is flushed, hashed and listed. Call it only once the framework's save returned."""
    started = time.monotonic()
    root = _local_directory(directory)
    if not root.is_dir():
        raise CheckpointError(f"{root} is not a directory")
    files = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST_FILE or path.name.startswith(_TEMP_PREFIX):
            continue
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        files.append(ManifestFile(rel, path.stat().st_size, _sha256(path)))
    if not files:
        raise CheckpointError(f"{root} holds no files to seal")
    finite, _ = finite_metrics(metrics)
    return _write_manifest(root, int(epoch), int(step), finite, files, started)


@dataclass(frozen=True)
class Manifest:
    directory: Path
    epoch: int
    step: int
    created_at: str
    files: List[ManifestFile]
    metrics: Dict[str, float]

    def path(self, relative: str) -> Path:
        return self.directory / relative


def read_checkpoint(directory: Union[str, os.PathLike], *, verify: bool = True) -> Manifest:
    """The manifest of a complete checkpoint; with `verify`, every file's size and digest
    are checked against it. Raises CheckpointError for an incomplete or altered one."""
    root = _local_directory(directory)
    manifest_path = root / MANIFEST_FILE
    try:
        raw = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{root} has no {MANIFEST_FILE}: the save did not finish") from None
    except ValueError as error:
        raise CheckpointError(f"{manifest_path} is not JSON: {error}") from None
    if raw.get("format") != MANIFEST_FORMAT:
        raise CheckpointError(
            f"{manifest_path} has format {raw.get('format')!r}, expected {MANIFEST_FORMAT!r}"
        )
    files = [ManifestFile(f["path"], int(f["sizeBytes"]), f["sha256"]) for f in raw["files"]]
    if verify:
        for entry in files:
            path = root / entry.path
            if not path.is_file():
                raise CheckpointError(f"{path} is listed in the manifest but missing")
            size = path.stat().st_size
            if size != entry.size_bytes:
                raise CheckpointError(
                    f"{path} has {size} bytes, the manifest says {entry.size_bytes}"
                )
            if _sha256(path) != entry.sha256:
                raise CheckpointError(f"{path} does not match its SHA-256 in the manifest")
    return Manifest(
        directory=root,
        epoch=int(raw["epoch"]),
        step=int(raw["step"]),
        created_at=str(raw["createdAt"]),
        files=files,
        metrics=dict(raw.get("metrics") or {}),
    )

