"""Experiment trackers through the API: a job chooses them in its spec (MLflow refused in words until an
admin sets it up), the new-job page reads which are offered, and the job page reads the job's runs and
downloads the files TensorBoard and W&B wrote as the job's artifacts."""
from __future__ import annotations

import io
import tarfile

from lanner.core import db
from lanner.core.models import Artifact, ArtifactKind
from lanner.core.settings import get_settings
from lanner.core.trackers import TrackerRun, TrackerRuns, trackers_dir, write_runs

from backend_helpers import CHAT_ROWS, upload

MODEL = "builtin/SmolLM2-135M-Instruct"


def submit(client, dataset_id: int, trackers: list[str]):
    return client.post("/api/jobs", json={"method": "lora", "model": MODEL, "dataset_id": dataset_id,
                                          "trackers": trackers})


def test_mlflow_is_offered_and_accepted_only_once_an_admin_has_set_it_up(team_with, wakes, monkeypatch):
    team = team_with(LANNER_MLFLOW_TRACKING_URI="")
    options = {option["name"]: option for option in team.alice.get("/api/trackers").json()}
    assert not options["mlflow"]["available"] and "LANNER_MLFLOW_TRACKING_URI" in options["mlflow"]["detail"]
    assert options["tensorboard"]["available"] and options["wandb"]["available"]
    dataset_id = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    refused = submit(team.alice, dataset_id, ["tensorboard", "mlflow"])
    assert refused.status_code == 422, refused.text
    [issue] = refused.json()["detail"]
    assert issue["loc"] == ["body", "trackers"] and "MLflow is not set up on this studio" in issue["msg"]
    accepted = submit(team.alice, dataset_id, ["tensorboard", "wandb"])
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["config"]["trackers"] == ["tensorboard", "wandb"]
    assert team.anonymous.get("/api/trackers").status_code == 401

    monkeypatch.setenv("LANNER_MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    monkeypatch.setenv("LANNER_MLFLOW_EXPERIMENT", "tuning")
    get_settings.cache_clear()  # the admin's change, read on the next request
    mlflow = team.alice.get("/api/trackers").json()[0]
    assert mlflow["available"] and mlflow["detail"] == "Runs in the experiment 'tuning' at http://mlflow.example:5000"
    assert submit(team.alice, dataset_id, ["mlflow"]).json()["config"]["trackers"] == ["mlflow"]


def test_a_jobs_tracker_runs_link_to_mlflow_and_the_files_of_the_others_are_artifacts(team, wakes):
    dataset_id = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    job_id = submit(team.alice, dataset_id, ["tensorboard", "wandb"]).json()["id"]
    assert team.bob.get(f"/api/jobs/{job_id}/trackers").json() == []  # not started yet
    folder = team.api.settings.artifacts_dir / str(job_id)
    files = trackers_dir(folder) / "tensorboard"
    files.mkdir(parents=True)
    (files / "events.out.tfevents.1").write_bytes(b"scalars")
    write_runs(folder, TrackerRuns(runs=[
        TrackerRun(tracker="mlflow", status="finished", run_id="abc", url="http://mlflow.example/#/experiments/1/runs/abc"),
        TrackerRun(tracker="tensorboard", status="finished"),
        TrackerRun(tracker="wandb", status="unavailable", problem="ValueError: disk full")]))
    with db.session_factory(team.api.settings.database_url)() as session:  # what the training process records
        session.add(Artifact(job_id=job_id, kind=ArtifactKind.tensorboard, name="tensorboard", size_bytes=7,
                             path=str(files.relative_to(team.api.settings.data_dir))))
        session.commit()

    runs = {run["tracker"]: run for run in team.bob.get(f"/api/jobs/{job_id}/trackers").json()}
    assert runs["mlflow"]["url"] == "http://mlflow.example/#/experiments/1/runs/abc"
    assert runs["wandb"] == {"tracker": "wandb", "status": "unavailable", "url": None, "run_id": None,
                             "problem": "ValueError: disk full"}

    [artifact] = team.bob.get(f"/api/jobs/{job_id}/artifacts").json()
    assert (artifact["kind"], artifact["name"]) == ("tensorboard", "tensorboard")
    archive = team.bob.get(f"/api/artifacts/{artifact['id']}/download", params={"archive": "tar"})
    assert archive.status_code == 200 and archive.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
        [member] = tar.getmembers()
        assert member.name == f"job-{job_id}-tensorboard/events.out.tfevents.1"
        assert tar.extractfile(member).read() == b"scalars"

    assert team.bob.get(f"/api/jobs/{job_id}/trackers/tensorboard/archive").status_code == 404  # no route of its own
    assert team.bob.get("/api/jobs/999/trackers").status_code == 404
    assert team.anonymous.get(f"/api/jobs/{job_id}/trackers").status_code == 401
