"""A trial's workers log into the MLflow run the hpo-tuner made for it.

The library does not log to MLflow itself: MLflow reads MLFLOW_TRACKING_URI
and MLFLOW_RUN_ID (which the planner sets from the trial's
`monitoring.mlflowRunId`), so a training script's `mlflow.start_run()` or
`mlflow.autolog()` resumes that run instead of making a second one.
"""

import os
import subprocess
import sys

import pytest

mlflow = pytest.importorskip("mlflow", reason="pip install mlflow")

WORKER = """
import mlflow
from trainyard.env import WorkerEnv

env = WorkerEnv.from_environ()
with mlflow.start_run() as run:
    mlflow.log_metric("loss", 0.25, step=1)
print(env.mlflow_run_id, run.info.run_id)
"""


def test_a_worker_logs_into_the_run_named_by_mlflow_run_id(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("ml/sweep", artifact_location=str(tmp_path / "artifacts"))
    # What the hpo-tuner does before it asks for the trial.
    made = client.create_run(experiment, run_name="sweep-t0000").info.run_id

    environ = dict(os.environ, MLFLOW_TRACKING_URI=uri, MLFLOW_RUN_ID=made)
    environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), "..", "src"), environ.get("PYTHONPATH", "")]
    )
    out = subprocess.run(
        [sys.executable, "-c", WORKER],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=tmp_path,
    ).stdout.split()

    assert out[-2:] == [made, made], "the worker read the run id and logged into that run"
    runs = client.search_runs([experiment])
    assert [r.info.run_id for r in runs] == [made], "no second run"
    assert [m.value for m in client.get_metric_history(made, "loss")] == [0.25]
