"""The worker's side of a job: take jobs from the database queue, run each in a fresh subprocess,
watch it (cancel key, device telemetry), and write the final status.

The subprocess is a separate interpreter so that a crash, an OOM or a cancel never poisons the
worker and the next job starts with a clean CUDA context. It dies with the worker (PDEATHSIG), so a
worker killed with SIGKILL leaves no training behind; its job is then failed by a sweep.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from redis import Redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from lanner.backend.db import session_factory
from lanner.backend.models import Artifact, Job, JobKind, JobStatus
from lanner.backend.queue import cancel_key, claim_next_job, fail_orphaned_jobs
from lanner.backend.redis_client import get_redis
from lanner.backend.settings import Settings
from lanner.backend.worker_registry import HEARTBEAT_SECONDS, live_workers
from lanner.worker.events import JobEvents, finish_job
from lanner.worker.job_process import EXIT_CANCELLED
from lanner.worker.telemetry import DeviceSampler

POLL_SECONDS = 0.5
CANCEL_GRACE_SECONDS = 7.0  # SIGTERM lets the trainer save a checkpoint; SIGKILL after this, within 10 s
_PR_SET_PDEATHSIG = 1
PROCESS_MODULES = {JobKind.train: "lanner.worker.train_process", JobKind.export: "lanner.worker.export_process"}
PROCESS_LABELS = {JobKind.train: "Training", JobKind.export: "Export"}


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the sweep still fails the job, the process may outlive the worker
        pass


def job_log_path(settings: Settings, job_id: int) -> Path:
    return settings.logs_dir / f"job-{job_id}.log"


def run_queue(settings: Settings, worker_name: str, device: dict) -> list[int]:
    """Runs queued jobs that fit this device until none is left; returns the ids it ran."""
    sessions = session_factory(settings.database_url)
    redis = get_redis(settings.redis_url)
    sweep_orphans(settings, worker_name)
    ran = []
    while True:
        with sessions() as session:
            job = claim_next_job(session, worker_name, device)
        if job is None:
            return ran
        run_job(settings, sessions, redis, job, worker_name, device)
        ran.append(job.id)


def run_job(settings: Settings, sessions: sessionmaker[Session], redis: Redis, job: Job,
            worker_name: str, device: dict) -> JobStatus:
    events = JobEvents(job.id, redis, sessions)
    events.status(JobStatus.running, worker=worker_name, device=device)
    settings.ensure_dirs()
    log_path = job_log_path(settings, job.id)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
           "LANNER_DATA_DIR": str(settings.data_dir), "LANNER_DATABASE_URL": settings.database_url,
           "LANNER_REDIS_URL": settings.redis_url}
    with open(log_path, "ab") as out:
        process = subprocess.Popen([sys.executable, "-m", PROCESS_MODULES[job.kind], str(job.id)],
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   preexec_fn=_die_with_parent)
    events.log(f"{PROCESS_LABELS[job.kind]} process started (pid {process.pid}) on {device.get('name')}")
    sampler = DeviceSampler(device, events.device, pid=process.pid)
    sampler.start()
    cancel_requested_at = None
    try:
        while process.poll() is None:
            time.sleep(POLL_SECONDS)
            if cancel_requested_at is None and _cancel_requested(redis, job.id):
                cancel_requested_at = time.monotonic()
                events.log("Cancel requested: stopping the training process")
                process.send_signal(signal.SIGTERM)
            elif cancel_requested_at is not None and time.monotonic() - cancel_requested_at > CANCEL_GRACE_SECONDS:
                process.kill()
                process.wait()
    finally:
        sampler.stop()
    status, error = _outcome(sessions, job.id, process.returncode, cancel_requested_at is not None, log_path)
    if finish_job(sessions, job.id, worker_name, status, error):
        events.status(status, error=error)
    redis.delete(cancel_key(job.id))
    return status


def _cancel_requested(redis: Redis, job_id: int) -> bool:
    try:
        return redis.get(cancel_key(job_id)) == "1"
    except Exception:  # Redis away for a moment: keep training, look again next poll
        return False


def _outcome(sessions: sessionmaker[Session], job_id: int, returncode: int, cancelled: bool,
             log_path: Path) -> tuple[JobStatus, str | None]:
    if returncode == 0:
        return JobStatus.succeeded, None
    if cancelled:
        return JobStatus.cancelled, None
    if returncode == EXIT_CANCELLED:  # a SIGTERM that was no cancel: the worker itself is stopping
        return JobStatus.failed, ("The worker stopped while running this job; training stopped at a step "
                                  "boundary and its last checkpoint is kept.")
    with sessions() as session:
        reported = session.get(Job, job_id).error
    if reported:  # the training process explains its own failures
        return JobStatus.failed, reported
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hint = " — most likely out of memory (the system's OOM killer)" if returncode == -signal.SIGKILL else ""
        return JobStatus.failed, f"The training process was killed by {name}{hint}."
    return JobStatus.failed, f"The training process exited with code {returncode}. End of its log:\n{_tail(log_path)}"


def _tail(path: Path, size: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return "(no log)"


def sweep_orphans(settings: Settings, worker_name: str | None = None) -> list[int]:
    """Fails running jobs that nothing runs any more, and publishes their status.

    With worker_name: that worker's running jobs. Called when its dispatch task starts, a moment at
    which the worker (one job at a time) runs nothing, so these are left from a previous life of a
    worker of the same name (killed, then restarted). Without: jobs whose worker has no heartbeat,
    read twice a heartbeat apart so that a Redis restart does not look like every worker dying.
    A job whose config asks for it ("requeue_on_worker_loss") and has a checkpoint is queued again
    to resume from its latest checkpoint instead of failing. Returns the ids of the jobs swept.
    """
    sessions = session_factory(settings.database_url)
    redis = get_redis(settings.redis_url)
    with sessions() as session:
        if worker_name:
            failed = fail_orphaned_jobs(
                session, set(), only_worker=worker_name,
                reason=f"The worker {worker_name} stopped while running this job (killed or crashed) "
                       f"and has restarted; the job did not finish.")
        else:
            alive = {record["name"] for record in live_workers(redis)}
            time.sleep(HEARTBEAT_SECONDS * 1.5)
            alive |= {record["name"] for record in live_workers(redis)}
            failed = fail_orphaned_jobs(session, alive)
        requeued = [job_id for job_id in failed if _requeue_from_checkpoint(session, settings, job_id)]
        errors = {job_id: session.get(Job, job_id).error for job_id in failed}
        resume = {job_id: session.get(Job, job_id).resume_from for job_id in requeued}
    for job_id in failed:
        events = JobEvents(job_id, redis, sessions)
        if job_id in requeued:
            events.status(JobStatus.queued, error=None, resume_from=resume[job_id])
            events.log(f"Its worker was lost; queued again to resume from {resume[job_id]}", level="warning")
        else:
            events.status(JobStatus.failed, error=errors[job_id])
    return failed


def latest_checkpoint(session: Session, settings: Settings, job_id: int) -> str | None:
    """The job's newest complete checkpoint. Its Artifact row is written after the trainer finished
    saving it, so a folder half-written when the worker died is never picked."""
    rows = session.execute(select(Artifact).where(Artifact.job_id == job_id, Artifact.kind == "checkpoint")
                           .order_by(Artifact.id.desc())).scalars()
    return next((row.name for row in rows if (settings.data_dir / row.path).is_dir()), None)


def _requeue_from_checkpoint(session: Session, settings: Settings, job_id: int) -> bool:
    """A job that asked for it (config "requeue_on_worker_loss") and has a checkpoint goes back to the
    queue to resume from its latest one, instead of staying failed."""
    job = session.get(Job, job_id)
    checkpoint = latest_checkpoint(session, settings, job_id) if (job.config or {}).get("requeue_on_worker_loss") else None
    if checkpoint is None:
        return False
    job.status, job.resume_from, job.worker, job.error, job.finished_at = (JobStatus.queued, checkpoint, None,
                                                                           None, None)
    session.commit()
    return True
