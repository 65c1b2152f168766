"""Experiment trackers: one tiny real training job logs to a real MLflow server on localhost, to
TensorBoard event files and to an offline W&B run, each read back with its own reader; a tracker
that cannot be reached is a warning and the job goes on."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from sqlalchemy import select

from lanner.core.models import Artifact, ArtifactKind
from lanner.core.settings import get_settings
from lanner.core.trackers import read_runs
from lanner.worker.job_process import artifacts_dir

from support import free_port
from tracker_files import MlflowServer, SlowProxy, tensorboard_scalars, wandb_history, wandb_records
from training_run import logs, step_metrics
from worker_helpers import REPO, qa_rows

STUDIO = "http://studio.example:8000"
SHORT = {"hyperparameters": {"max_steps": 3, "save_steps": 3, "eval_fraction": 0.0, "before_after_eval": False}}


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real MLflow server, started at once and waited for where a test reads it (it boots in about
    20 s, while the first test trains)."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    yield server
    server.stop()


@pytest.fixture
def tracking_uri(monkeypatch):
    """Sets the admin's MLflow tracking URI, for the spec's check and the training process."""
    def set_up(uri: str) -> dict:
        monkeypatch.setenv("LANNER_MLFLOW_TRACKING_URI", uri)
        get_settings.cache_clear()
        return {"LANNER_MLFLOW_TRACKING_URI": uri, "LANNER_MLFLOW_EXPERIMENT": "lanner-tests",
                "LANNER_PUBLIC_URL": STUDIO}

    yield set_up
    get_settings.cache_clear()


def train(studio, job_id: int, env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "lanner.worker.train_process", str(job_id)], cwd=REPO,
                          env={**studio.env, **env}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_an_unreachable_mlflow_server_is_a_warning_and_the_job_succeeds(studio, tracking_uri, mlflow_server):
    # mlflow_server is not this test's: it boots meanwhile for the next one
    nowhere = f"http://127.0.0.1:{free_port()}"
    env = tracking_uri(nowhere)
    job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(12)), {
        "hyperparameters": {**SHORT["hyperparameters"], "max_steps": 1, "save_steps": 1}, "trackers": ["mlflow"]})
    train(studio, job_id, env)
    assert studio.get_job(job_id).error is None
    warnings = [line for line in logs(studio, job_id) if line.startswith("MLflow at")]
    assert len(warnings) == 1 and warnings[0].startswith(f"MLflow at {nowhere} failed (")
    assert warnings[0].endswith("the job goes on without it")
    run = read_runs(artifacts_dir(studio.data_dir, job_id)).get("mlflow")
    assert run.status == "unavailable" and run.problem


def test_one_job_logs_its_spec_metrics_and_links_to_mlflow_tensorboard_and_wandb(studio, mlflow_server,
                                                                                  tracking_uri):
    env = tracking_uri(mlflow_server.wait_ready().url)
    job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(12)),
                        {**SHORT, "trackers": ["mlflow", "tensorboard", "wandb"]}, name="tracked")
    train(studio, job_id, env)
    streamed = {metrics["step"]: metrics["loss"] for metrics in step_metrics(studio, job_id)}
    assert sorted(streamed) == [1, 2, 3]
    job_folder = artifacts_dir(studio.data_dir, job_id)
    runs = read_runs(job_folder)
    assert [(run.tracker, run.status) for run in runs.runs] == [
        ("mlflow", "finished"), ("tensorboard", "finished"), ("wandb", "finished")], runs

    # MLflow: the spec as parameters, every step's metrics, the job's id and links as tags
    mlflow_run = runs.get("mlflow")
    assert mlflow_run.url.startswith(f"{mlflow_server.url}/#/experiments/")
    run = mlflow_server.api(f"runs/get?run_id={mlflow_run.run_id}")["run"]
    params = {param["key"]: param["value"] for param in run["data"]["params"]}
    assert params["method"] == "lora" and params["hyperparameters.learning_rate"] == "0.001"
    assert params["lora.target_modules"] == '["q_proj", "v_proj"]' and params["trackers"].startswith('["mlflow"')
    tags = {tag["key"]: tag["value"] for tag in run["data"]["tags"]}
    assert tags["lanner.job_id"] == str(job_id) and tags["mlflow.runName"] == "tracked"
    assert tags["lanner.job_url"] == f"{STUDIO}/jobs/{job_id}"
    assert tags["lanner.artifact.adapter"].startswith(f"{STUDIO}/api/artifacts/")
    assert tags["lanner.artifact.adapter"].endswith("/download?archive=tar")
    assert run["info"]["status"] == "FINISHED"
    history = mlflow_server.api(f"metrics/get-history?run_id={mlflow_run.run_id}&metric_key=loss")["metrics"]
    assert {point["step"]: point["value"] for point in history} == pytest.approx(streamed)
    assert "learning_rate" in {metric["key"] for metric in run["data"]["metrics"]}

    # TensorBoard's and W&B's folders are the job's artifacts, downloaded as any folder artifact
    with studio.sessions() as session:
        recorded = {row.kind: row for row in session.scalars(select(Artifact).where(Artifact.job_id == job_id))}
    for kind in (ArtifactKind.tensorboard, ArtifactKind.wandb):
        assert studio.data_dir / recorded[kind].path == job_folder / "trackers" / kind.value
        assert recorded[kind].name == kind.value and recorded[kind].size_bytes > 0

    # TensorBoard: event files under the job's folder, read by TensorBoard's own reader
    scalars = tensorboard_scalars(job_folder / "trackers" / "tensorboard")
    assert dict(scalars["loss"]) == pytest.approx(streamed)
    assert "grad_norm" in scalars

    # W&B: an offline run (nothing sent anywhere) whose run file holds the config, every step and the links
    run_files = list((job_folder / "trackers" / "wandb").glob("wandb/offline-run-*/run-*.wandb"))
    assert len(run_files) == 1, run_files
    steps = {row["_step"]: row["loss"] for row in wandb_history(run_files[0]) if "loss" in row}
    assert steps == pytest.approx(streamed)
    records = {}
    for record in wandb_records(run_files[0]):
        records.setdefault(record.WhichOneof("record_type"), []).append(getattr(record, record.WhichOneof("record_type")))
    config = {item.key: json.loads(item.value_json) for item in records["run"][0].config.update}
    assert config["method"] == "lora" and config["hyperparameters"]["learning_rate"] == 0.001
    links = {item.key: json.loads(item.value_json) for summary in records["summary"] for item in summary.update
             if item.key.startswith("lanner/")}
    assert links["lanner/job_url"] == f"{STUDIO}/jobs/{job_id}" and "lanner/artifact.adapter" in links
    assert records["exit"][0].exit_code == 0


def test_mlflow_unset_since_the_job_was_queued_is_said_and_nothing_is_logged_elsewhere(studio, tmp_path, monkeypatch):
    from lanner.core.settings import Settings
    from lanner.worker.events import JobEvents
    from lanner.worker.training.trackers import JobTrackers

    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # where MLflow's client would write ./mlruns or ./mlflow.db without a URI
    job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(4)))
    events = JobEvents(job_id, studio.redis, studio.sessions)
    trackers = JobTrackers(["mlflow"], events, Settings(data_dir=studio.data_dir), artifacts_dir(studio.data_dir, job_id))
    trackers.start(job_id, "job", {"method": "lora"})
    trackers.log_metrics(1, {"loss": 1.0})
    trackers.finish("finished", {})
    assert logs(studio, job_id) == ["MLflow failed (RuntimeError: MLflow is not set up on this studio: an admin sets "
                                    "LANNER_MLFLOW_TRACKING_URI (and LANNER_MLFLOW_EXPERIMENT) first); the job goes "
                                    "on without it"]
    assert list(elsewhere.iterdir()) == []


def test_a_slow_mlflow_server_never_holds_a_step(mlflow_server, tmp_path, monkeypatch):
    """Steps go to MLflow from a thread with a bounded queue (MLFLOW_QUEUE_STEPS); the end waits at most
    MLFLOW_FLUSH_TIMEOUT_S for them. Against the real server behind a proxy that holds each request."""
    from lanner.core.settings import Settings
    from lanner.worker.training import trackers

    proxy = SlowProxy(mlflow_server.wait_ready().url)

    def tracker(name: str) -> trackers.MlflowTracker:
        settings = Settings(data_dir=tmp_path, mlflow_tracking_uri=proxy.url, mlflow_experiment="lanner-tests")
        made = trackers.MlflowTracker(settings, tmp_path)
        proxy.delay = 0.0
        made.start(1, name, {"method": "lora"}, None)
        return made

    try:
        slow = tracker("slow server")
        proxy.delay = 0.4  # a request: 0.4 s more; 30 synchronous steps would take 12 s
        began = time.monotonic()
        for step in range(1, 31):
            slow.log_metrics(step, {"loss": 1.0 / step})
        assert time.monotonic() - began < 2  # synchronous: 12 s
        assert slow.finish("finished", {"job_url": f"{STUDIO}/jobs/1"}) is None  # all steps went, a few a request
        history = mlflow_server.api(f"metrics/get-history?run_id={slow.run_id}&metric_key=loss")["metrics"]
        assert sorted(point["step"] for point in history) == list(range(1, 31))
        assert mlflow_server.api(f"runs/get?run_id={slow.run_id}")["run"]["info"]["status"] == "FINISHED"

        # A server slower still: the queue holds MLFLOW_QUEUE_STEPS steps, the rest are dropped, and the end
        # gives up after MLFLOW_FLUSH_TIMEOUT_S (the tracker is then dropped with that reason, in words).
        monkeypatch.setattr(trackers, "MLFLOW_QUEUE_STEPS", 5)
        monkeypatch.setattr(trackers, "MLFLOW_FLUSH_TIMEOUT_S", 1)
        stuck = tracker("stuck server")
        proxy.delay = 3.0
        for step in range(1, 21):
            stuck.log_metrics(step, {"loss": 1.0})
        assert stuck.steps.qsize() == 5 and stuck.dropped >= 1  # the thread's first request hangs meanwhile
        began = time.monotonic()
        with pytest.raises(RuntimeError, match=r"took more than 1 s to take the last \d+ steps"):
            stuck.finish("finished", {})
        assert time.monotonic() - began < 5  # waiting for the queued steps: 3 s a request
    finally:
        proxy.shutdown()


def test_a_tracker_that_fell_behind_says_so_at_the_end(mlflow_server, studio, monkeypatch, tracking_uri):
    from lanner.core.settings import Settings
    from lanner.worker.events import JobEvents
    from lanner.worker.training import trackers

    proxy = SlowProxy(mlflow_server.wait_ready().url)
    try:
        tracking_uri(proxy.url)
        monkeypatch.setattr(trackers, "MLFLOW_QUEUE_STEPS", 2)
        job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(4)))
        events = JobEvents(job_id, studio.redis, studio.sessions)
        settings = Settings(data_dir=studio.data_dir, mlflow_tracking_uri=proxy.url, mlflow_experiment="lanner-tests")
        job = trackers.JobTrackers(["mlflow"], events, settings, artifacts_dir(studio.data_dir, job_id))
        job.start(job_id, "behind", {"method": "lora"})
        proxy.delay = 0.5
        for step in range(1, 8):
            job.log_metrics(step, {"loss": 1.0})
        job.finish("finished", {})
        warnings = [line for line in logs(studio, job_id) if "fell behind" in line]
        assert len(warnings) == 1 and "steps were not logged to it (more than 2 waited for the server)" in warnings[0]
        assert read_runs(artifacts_dir(studio.data_dir, job_id)).get("mlflow").status == "finished"
    finally:
        proxy.shutdown()
