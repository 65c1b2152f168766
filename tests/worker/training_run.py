"""Running the training process on its own (no Celery) for one job, and reading what it streamed."""
from __future__ import annotations

import subprocess
import sys

from lanner.core.streams import job_stream, read_after

from worker_helpers import REPO


def run_train_process(studio, job_id: int, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lanner.worker.train_process", str(job_id)], cwd=REPO,
                          env=studio.env, capture_output=True, text=True, timeout=timeout)


def trained(studio, job_id: int) -> subprocess.CompletedProcess:
    """Runs the job and checks that it finished."""
    done = run_train_process(studio, job_id)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def events(studio, job_id: int) -> list[tuple[str, str, dict]]:
    return read_after(studio.redis, job_stream(job_id), count=10_000)


def step_metrics(studio, job_id: int) -> list[dict]:
    return [data for _, kind, data in events(studio, job_id) if kind == "metric" and "loss" in data]


def logs(studio, job_id: int) -> list[str]:
    return [data["message"] for _, kind, data in events(studio, job_id) if kind == "log"]
