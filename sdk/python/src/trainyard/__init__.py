"""Trainyard's worker library: report progress, metrics and checkpoints from training.

```python
import trainyard

reporter = trainyard.Reporter()          # identity, rank, resume point from the environment
reporter.progress(epoch, metrics={"loss": loss})
```

See README.md for checkpoints, framework callbacks and the `trainyard-run` wrapper.
"""

from .checkpoint import (
    MANIFEST_FILE,
    CheckpointError,
    CheckpointWriter,
    Manifest,
    SavedCheckpoint,
    read_checkpoint,
    seal_checkpoint,
)
from .env import EnvError, WorkerEnv
from .reporter import Reporter, ReporterStats

__all__ = [
    "MANIFEST_FILE",
    "CheckpointError",
    "CheckpointWriter",
    "EnvError",
    "Manifest",
    "Reporter",
    "ReporterStats",
    "SavedCheckpoint",
    "WorkerEnv",
    "read_checkpoint",
    "seal_checkpoint",
]
