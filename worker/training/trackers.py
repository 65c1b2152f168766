"""Experiment trackers, run in the training process: each starts a run with the job's spec as its
parameters, logs every step's metrics, and at the end the links to the job's artifacts in the studio
and how the job ended. MLflow logs to the admin's tracking server (LANNER_MLFLOW_TRACKING_URI);
TensorBoard (tensorboardX's writer: event files, no TensorFlow, no server) and W&B (offline only)
write into the job's folder, which the job page offers as a download.

A tracker never fails the job: the first error of one (a server that does not answer, a full disk)
is a warning in words on the job's stream, and the job goes on without that tracker."""
from __future__ import annotations

import json
import math
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from lanner.core.settings import Settings
from lanner.core.spec import MLFLOW_NOT_SET_UP
from lanner.core.trackers import FOLDERS, TrackerRun, TrackerRuns, mlflow_run_url, read_runs, trackers_dir, write_runs
from lanner.worker.events import JobEvents

# How long one request to the MLflow server may take; it is not retried (a tracker that fails is dropped).
MLFLOW_TIMEOUT_S = 10
# Steps waiting for the MLflow server (beyond, a step is dropped), and how long the end waits for them.
MLFLOW_QUEUE_STEPS = 1000
MLFLOW_FLUSH_TIMEOUT_S = 30
LABELS = {"mlflow": "MLflow", "tensorboard": "TensorBoard", "wandb": "W&B"}
# How a job ended, in each tracker's words.
MLFLOW_STATUS = {"finished": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
WANDB_EXIT_CODE = {"finished": 0, "failed": 1, "cancelled": 3}


def flat_params(spec: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The spec as flat parameters: nested fields as dotted names, lists as JSON."""
    params: dict[str, str] = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            params.update(flat_params(value, f"{name}."))
        else:
            params[name] = value if isinstance(value, str) else json.dumps(value)
    return params


def numbers(values: dict[str, Any]) -> dict[str, float]:
    return {key: float(value) for key, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}


class MlflowTracker:
    name = "mlflow"

    def __init__(self, settings: Settings, folder: Path):
        # Set before mlflow reads them: one try per request, and a short wait.
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(MLFLOW_TIMEOUT_S)
        from mlflow.tracking import MlflowClient

        if not settings.mlflow_tracking_uri:  # unset since the job was queued; MLflow would write to ./mlruns
            raise RuntimeError(MLFLOW_NOT_SET_UP)
        self.uri = settings.mlflow_tracking_uri
        self.experiment = settings.mlflow_experiment
        self.client = MlflowClient(tracking_uri=self.uri)
        self.run_id: str | None = None
        # Steps go to the server from a thread of their own, so a slow server never holds a training step.
        self.steps: queue.Queue = queue.Queue(maxsize=MLFLOW_QUEUE_STEPS + 1)  # + 1: finish's end mark
        self.sender: threading.Thread | None = None
        self.failure: Exception | None = None
        self.dropped = 0

    def start(self, job_id: int, name: str, spec: dict[str, Any], previous: TrackerRun | None) -> TrackerRun:
        from mlflow.entities import Param, RunTag
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        found = self.client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(self.experiment)
        if previous and previous.run_id:  # a requeued job logs on into the run it started
            self.run_id = previous.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            run = self.client.create_run(experiment_id, run_name=name,
                                         tags={"lanner.job_id": str(job_id), "lanner.method": spec["method"]})
            self.run_id = run.info.run_id
            params = [Param(key, value[:MAX_PARAM_VAL_LENGTH]) for key, value in flat_params(spec).items()]
            for start in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
                self.client.log_batch(self.run_id, params=params[start:start + MAX_PARAMS_TAGS_PER_BATCH])
        self.client.log_batch(self.run_id, tags=[RunTag("lanner.job_id", str(job_id))])
        return TrackerRun(tracker=self.name, status="running", run_id=self.run_id,
                          url=mlflow_run_url(self.uri, experiment_id, self.run_id))

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        """Hands the step to the logging thread without waiting for the server; a step that finds
        MLFLOW_QUEUE_STEPS steps still waiting is dropped (counted and said at the end). The thread's
        failure is raised here, on the next step: the tracker is then dropped."""
        self._raise_if_failed()
        if self.sender is None:
            self.sender = threading.Thread(target=self._send, daemon=True, name="lanner-mlflow")
            self.sender.start()
        if self.steps.qsize() >= MLFLOW_QUEUE_STEPS:
            self.dropped += 1
        else:
            self.steps.put_nowait((step, values, int(time.time() * 1000)))

    def _send(self) -> None:
        """The logging thread: sends what waits, several steps a request, until finish's None."""
        from mlflow.entities import Metric
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        done = False
        while not done:
            batch = [self.steps.get()]
            while batch[-1] is not None and sum(len(values) for _, values, _ in batch) < MAX_METRICS_PER_BATCH:
                try:
                    batch.append(self.steps.get_nowait())
                except queue.Empty:
                    break
            done = batch[-1] is None
            metrics = [Metric(key, value, at, step) for step, values, at in batch[:-1 if done else None]
                       for key, value in values.items()]
            try:
                for start in range(0, len(metrics), MAX_METRICS_PER_BATCH):
                    self.client.log_batch(self.run_id, metrics=metrics[start:start + MAX_METRICS_PER_BATCH])
            except Exception as error:  # raised to the training loop at its next step or at the end
                self.failure = error
                return

    def _raise_if_failed(self) -> None:
        if self.failure is not None:
            raise self.failure

    def finish(self, outcome: str, links: dict[str, str]) -> str | None:
        """Waits at most MLFLOW_FLUSH_TIMEOUT_S for the steps still queued, then ends the run. Returns
        a warning in words when steps were dropped."""
        from mlflow.entities import RunTag

        if self.sender is not None:
            self.steps.put(None)  # room is kept for it: the thread is taking steps off
            self.sender.join(MLFLOW_FLUSH_TIMEOUT_S)
            if self.sender.is_alive():
                raise RuntimeError(f"the server took more than {MLFLOW_FLUSH_TIMEOUT_S} s to take the last "
                                   f"{self.steps.qsize()} steps; they are not logged and the run is not ended")
            self._raise_if_failed()
        tags = [RunTag(f"lanner.{key}", url) for key, url in links.items()]
        if self.dropped:
            tags.append(RunTag("lanner.dropped_steps", str(self.dropped)))
        self.client.log_batch(self.run_id, tags=tags)
        self.client.set_terminated(self.run_id, status=MLFLOW_STATUS[outcome])
        if self.dropped:
            return (f"MLflow at {self.uri} fell behind: {self.dropped} steps were not logged to it "
                    f"(more than {MLFLOW_QUEUE_STEPS} waited for the server)")
        return None


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, settings: Settings, folder: Path):
        self.folder = folder
        self.writer = None

    def start(self, job_id: int, name: str, spec: dict[str, Any], previous: TrackerRun | None) -> TrackerRun:
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(logdir=str(self.folder), flush_secs=10)
        self.writer.add_text("spec", f"```\n{json.dumps(spec, indent=2)}\n```")
        return TrackerRun(tracker=self.name, status="running")

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def finish(self, outcome: str, links: dict[str, str]) -> None:
        self.writer.add_text("links", "\n".join(f"- {key}: {url}" for key, url in links.items()))
        self.writer.add_text("outcome", outcome)
        self.writer.close()


class WandbTracker:
    name = "wandb"

    def __init__(self, settings: Settings, folder: Path):
        os.environ["WANDB_MODE"] = "offline"  # never online: nothing leaves this machine
        os.environ["WANDB_SILENT"] = "true"
        self.folder = folder
        self.project = settings.wandb_project
        self.run = None

    def start(self, job_id: int, name: str, spec: dict[str, Any], previous: TrackerRun | None) -> TrackerRun:
        import wandb

        self.folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(mode="offline", dir=str(self.folder), project=self.project, name=name,
                              id=f"lanner-job-{job_id}", config=spec, tags=[f"lanner-job-{job_id}"],
                              settings=wandb.Settings(console="off", x_disable_stats=True, save_code=False,
                                                      disable_git=True))
        return TrackerRun(tracker=self.name, status="running", run_id=self.run.id)

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def finish(self, outcome: str, links: dict[str, str]) -> None:
        self.run.summary.update({f"lanner/{key}": url for key, url in links.items()})
        self.run.finish(exit_code=WANDB_EXIT_CODE[outcome])


TRACKER_CLASSES = {cls.name: cls for cls in (MlflowTracker, TensorBoardTracker, WandbTracker)}


class JobTrackers:
    """The trackers a job chose. Each call goes to every tracker still working; one that raises is
    dropped, with a warning on the job's stream and the reason in the job's tracker record."""

    def __init__(self, names: list[str], events: JobEvents, settings: Settings, job_artifacts: Path):
        self.events = events
        self.settings = settings
        self.job_artifacts = job_artifacts
        self.runs: TrackerRuns = read_runs(job_artifacts)
        self.trackers: list = []
        for name in names:
            folder = trackers_dir(job_artifacts) / FOLDERS.get(name, name)
            self._call(name, lambda: self.trackers.append(TRACKER_CLASSES[name](settings, folder)))

    def _call(self, name: str, action) -> bool:
        try:
            action()
            return True
        except Exception as error:  # whatever a tracker raises, training goes on without it
            problem = f"{type(error).__name__}: {error}".strip()[:500]
            uri = self.settings.mlflow_tracking_uri
            where = f" at {uri}" if name == "mlflow" and uri else ""
            self.events.log(f"{LABELS[name]}{where} failed ({problem}); the job goes on without it",
                            level="warning")
            self.trackers = [tracker for tracker in self.trackers if tracker.name != name]
            previous = self.runs.get(name)
            self.runs.put((previous or TrackerRun(tracker=name, status="unavailable")).model_copy(
                update={"status": "unavailable", "problem": problem}))
            self._save()
            return False

    def _save(self) -> None:
        try:
            write_runs(self.job_artifacts, self.runs)
        except OSError as error:
            self.events.log(f"The trackers' record could not be written: {error}", level="warning")

    def start(self, job_id: int, name: str, spec: dict[str, Any]) -> None:
        for tracker in list(self.trackers):
            def start(tracker=tracker):
                self.runs.put(tracker.start(job_id, name, spec, self.runs.get(tracker.name)))
            if self._call(tracker.name, start):
                self.events.log(f"Logging to {LABELS[tracker.name]}"
                                + (f": {url}" if (url := self.runs.get(tracker.name).url) else ""))
        self._save()

    def log_metrics(self, step: int, values: dict[str, Any]) -> None:
        if self.trackers and (logged := numbers(values)):
            for tracker in list(self.trackers):
                self._call(tracker.name, lambda tracker=tracker: tracker.log_metrics(step, logged))

    def finish(self, outcome: str, links: dict[str, str]) -> None:
        for tracker in list(self.trackers):
            warnings = []
            if self._call(tracker.name, lambda tracker=tracker: warnings.append(tracker.finish(outcome, links))):
                self.runs.put(self.runs.get(tracker.name).model_copy(update={"status": outcome}))
                if warnings[0]:
                    self.events.log(warnings[0], level="warning")
        self.trackers = []
        self._save()
