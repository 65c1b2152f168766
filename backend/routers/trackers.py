"""Experiment trackers: the ones this studio offers a new job, and a job's runs in them (the MLflow run's
page, the status, why one stopped). The files TensorBoard and W&B wrote into the job's folder are its
artifacts (kinds tensorboard and wandb), downloaded as any other."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends, HTTPException
from sqlalchemy.orm import Session

from lanner.backend.deps import current_user, get_db
from lanner.backend.schemas.common import SIGNED_IN_ERRORS, PathId, errors
from lanner.backend.schemas.trackers import TrackerOption
from lanner.core.models import Job, User
from lanner.core.settings import Settings, get_settings
from lanner.core.spec import MLFLOW_NOT_SET_UP
from lanner.core.storage import local_copy
from lanner.core.trackers import TRACKERS_FOLDER, TrackerRun, read_runs

router = APIRouter(tags=["trackers"], responses=SIGNED_IN_ERRORS)


@router.get("/api/trackers", response_model=list[TrackerOption])
def tracker_options(_: User = Depends(current_user), settings: Settings = Depends(get_settings)) -> list[TrackerOption]:
    mlflow = settings.mlflow_tracking_uri
    return [
        TrackerOption(name="mlflow", label="MLflow", available=bool(mlflow),
                      detail=f"Runs in the experiment {settings.mlflow_experiment!r} at {mlflow}" if mlflow
                      else MLFLOW_NOT_SET_UP),
        TrackerOption(name="tensorboard", label="TensorBoard", available=True,
                      detail="Event files in the job's folder, one of its artifacts once it ends"),
        TrackerOption(name="wandb", label="Weights & Biases", available=True,
                      detail=f"An offline run (project {settings.wandb_project!r}) in the job's folder, one of its "
                             "artifacts once it ends; `wandb sync` uploads it"),
    ]


def _job_folder(session: Session, settings: Settings, job_id: int) -> Path:
    """The folder holding the job's trackers folder on this machine: the job's artifacts folder in the
    data dir, or the cache entry of its stored trackers folder (pushed when training ends)."""
    if session.get(Job, job_id) is None:
        raise HTTPException(404, f"No job {job_id}")
    try:
        return local_copy(settings, f"artifacts/{job_id}/{TRACKERS_FOLDER}").parent
    except FileNotFoundError:
        return settings.artifacts_dir / str(job_id)  # none stored (yet): no runs to show


@router.get("/api/jobs/{job_id}/trackers", response_model=list[TrackerRun], responses=errors(404))
def job_tracker_runs(job_id: PathId, _: User = Depends(current_user), session: Session = Depends(get_db),
                     settings: Settings = Depends(get_settings)) -> list[TrackerRun]:
    return read_runs(_job_folder(session, settings, job_id)).runs
