"""Experiment trackers through the API: a job chooses them in its spec (MLflow refused in words until an
admin sets it up), the new-job page reads which are offered, and the job page reads the job's runs and
downloads the files TensorBoard and W&B wrote."""
from __future__ import annotations

import io
import tarfile

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


def test_a_jobs_tracker_runs_link_to_mlflow_and_download_the_files_of_the_others(team, wakes):
    dataset_id = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    job_id = submit(team.alice, dataset_id, ["tensorboard", "wandb"]).json()["id"]
    assert team.bob.get(f"/api/jobs/{job_id}/trackers").json() == []  # not started yet
    folder = team.api.settings.artifacts_dir / str(job_id)
    (trackers_dir(folder) / "tensorboard").mkdir(parents=True)
    (trackers_dir(folder) / "tensorboard" / "events.out.tfevents.1").write_bytes(b"scalars")
    write_runs(folder, TrackerRuns(runs=[
        TrackerRun(tracker="mlflow", status="finished", run_id="abc", url="http://mlflow.example/#/experiments/1/runs/abc"),
        TrackerRun(tracker="tensorboard", status="finished"),
        TrackerRun(tracker="wandb", status="unavailable", problem="ValueError: disk full")]))

    runs = {run["tracker"]: run for run in team.bob.get(f"/api/jobs/{job_id}/trackers").json()}
    assert runs["mlflow"]["url"] == "http://mlflow.example/#/experiments/1/runs/abc" and runs["mlflow"]["download"] is None
    assert runs["tensorboard"]["download"] == f"/api/jobs/{job_id}/trackers/tensorboard/archive"
    assert runs["wandb"] == {"tracker": "wandb", "status": "unavailable", "url": None, "run_id": None,
                             "problem": "ValueError: disk full", "download": None}

    archive = team.bob.get(runs["tensorboard"]["download"])
    assert archive.status_code == 200 and archive.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
        [member] = tar.getmembers()
        assert member.name == f"job-{job_id}-tensorboard/events.out.tfevents.1"
        assert tar.extractfile(member).read() == b"scalars"

    wandb = team.bob.get(f"/api/jobs/{job_id}/trackers/wandb/archive")
    assert wandb.status_code == 404 and wandb.json()["detail"] == f"Job {job_id} has no wandb files"
    mlflow = team.bob.get(f"/api/jobs/{job_id}/trackers/mlflow/archive")
    assert mlflow.status_code == 404 and "tensorboard and wandb do" in mlflow.json()["detail"]
    assert team.bob.get("/api/jobs/999/trackers").status_code == 404
    assert team.anonymous.get(f"/api/jobs/{job_id}/trackers").status_code == 401
