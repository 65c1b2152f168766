"""What the API and the training process share about a job's experiment trackers: where their files
lie (DATA_DIR/artifacts/<job>/trackers/) and the record of the runs the training process started
(trackers.json there), which the job page reads for its links."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from lanner.core.spec import Tracker

TRACKERS_FOLDER = "trackers"
RUNS_FILE = "trackers.json"
# The trackers that write files into the job's folder: each folder becomes an artifact of the job (its kind
# the tracker's name) when the training process ends the trackers.
FOLDERS: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb"}


class TrackerRun(BaseModel):
    tracker: Tracker
    status: Literal["running", "finished", "failed", "cancelled", "unavailable"]
    url: str | None = None        # MLflow: the run's page on the tracking server
    run_id: str | None = None
    problem: str | None = None    # why the tracker stopped logging (the job went on without it)


class TrackerRuns(BaseModel):
    runs: list[TrackerRun] = []

    def get(self, tracker: str) -> TrackerRun | None:
        return next((run for run in self.runs if run.tracker == tracker), None)

    def put(self, run: TrackerRun) -> None:
        self.runs = [other for other in self.runs if other.tracker != run.tracker] + [run]


def trackers_dir(job_artifacts: Path) -> Path:
    return job_artifacts / TRACKERS_FOLDER


def read_runs(job_artifacts: Path) -> TrackerRuns:
    path = trackers_dir(job_artifacts) / RUNS_FILE
    try:
        return TrackerRuns.model_validate_json(path.read_text())
    except (OSError, ValueError):  # none yet, or half written by a process that died
        return TrackerRuns()


def write_runs(job_artifacts: Path, runs: TrackerRuns) -> None:
    path = trackers_dir(job_artifacts) / RUNS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(runs.model_dump_json(indent=2))
    os.replace(partial, path)  # a reader never sees half a file


def mlflow_run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """The run's page in the MLflow UI, when the tracking URI is a server's address."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
