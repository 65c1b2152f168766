"""The worker's side of a job: take jobs from the database queue, reserve the devices each needs
(this worker's own, and for a job on N GPUs N - 1 idle ones of this machine: docs/multi-gpu.md), run
it in a fresh subprocess (a job on several devices: under lanner.worker.distributed.launcher),
watch it (cancel key, device telemetry), and write the final status.

The subprocess is a separate interpreter so that a crash, an OOM or a cancel never poisons the
worker and the next job starts with a clean CUDA context. It dies with the worker (PDEATHSIG), so a
worker killed with SIGKILL leaves no training behind; its job is then failed by a sweep.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from redis import Redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from lanner.core.db import session_factory
from lanner.core.models import Artifact, ArtifactKind, Job, JobKind, JobStatus
from lanner.core.queue.order import job_summary, publish_queue_event
from lanner.core.messages.device import Device, Placement, WorkerRecord, devices_of
from lanner.core.messages.signals import cancel_requested, clear_cancel
from lanner.core.queue.claim import (claim_next_job, has_runnable_job, multi_device_capacity,
                                     note_waiting_jobs, requeue_stopped_job, sweep_orphaned_jobs, unclaim_job,
                                     wake_worker, wake_workers)
from lanner.core.redis_client import get_redis
from lanner.core.settings import Settings
from lanner.core.storage import get_store
from lanner.core.spec import MAX_REQUEUES
from lanner.core.worker_registry import (HEARTBEAT_SECONDS, device_holders, keep_devices, largest_machine,
                                         live_workers, release_devices, reserve_devices)
from lanner.worker.devices import free_memory, is_local
from lanner.worker.events import FLUSH_SECONDS, JobEvents, finish_job
from lanner.worker.job_process import EXIT_CANCELLED, EXIT_PARTIAL
from lanner.worker.telemetry import DeviceSampler

POLL_SECONDS = 0.5
OWNERSHIP_CHECK_SECONDS = 5.0  # how often a running job's worker checks that the job is still its own
CANCEL_GRACE_SECONDS = 7.0  # SIGTERM lets the trainer save a checkpoint; SIGKILL after this, within 10 s
# A drain lets the step end and its checkpoint be written, however long a step takes on a big model; SIGKILL
# (the job requeued from its last checkpoint on record) after this, within docker-compose's stop_grace_period.
DRAIN_GRACE_SECONDS = 540.0
_PR_SET_PDEATHSIG = 1
PROCESS_MODULES = {JobKind.train: "lanner.worker.train_process", JobKind.export: "lanner.worker.export_process",
                   JobKind.chat: "lanner.worker.chat_process"}
PROCESS_LABELS = {JobKind.train: "Training", JobKind.export: "Export", JobKind.chat: "GPU chat"}

log = logging.getLogger(__name__)

# Set when this worker is stopping (SIGTERM: lanner.worker.celery_app): it claims no new job, and the
# job it runs saves a checkpoint at the end of its step and goes back to the queue.
draining = threading.Event()


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the sweep still fails the job, the process may outlive the worker
        pass


def job_log_path(settings: Settings, job_id: int) -> Path:
    return settings.logs_dir / f"job-{job_id}.log"


class DeviceLease:
    """The devices this worker's job holds in the registry: taken all or nothing, kept alive while
    the job runs (their reservations expire a few seconds after a worker dies), freed on every exit
    path of the `with` block."""

    def __init__(self, redis: Redis, holder: str):
        self.redis = redis
        self.holder = holder
        self.device_ids: list[str] = []
        self._stop = threading.Event()
        self._keeper = threading.Thread(target=self._keep, daemon=True, name="lanner-device-lease")

    def take(self, device_ids: list[str]) -> bool:
        wanted = list(dict.fromkeys([*self.device_ids, *device_ids]))
        if not reserve_devices(self.redis, wanted, self.holder):
            return False
        self.device_ids = wanted
        if not self._keeper.is_alive():
            self._keeper.start()
        return True

    def _keep(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                keep_devices(self.redis, self.device_ids, self.holder)
            except Exception:  # Redis away for a moment: try again at the next beat
                pass

    def __enter__(self) -> "DeviceLease":
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        try:
            release_devices(self.redis, self.device_ids, self.holder)
        except Exception:  # Redis away: the reservations expire by themselves
            log.warning("could not release devices %s", self.device_ids, exc_info=True)


def _machine(redis: Redis, device: Device) -> list[WorkerRecord]:
    """The live workers' records of the other devices of this machine (same kind), idle or busy."""
    return [record for record in live_workers(redis)
            if record.device.id != device.id and record.device.kind == device.kind and is_local(record.device)]


def idle_devices(redis: Redis, device: Device) -> list[Device]:
    """The other devices of this machine (same kind) that a live worker owns and no job holds, with
    their free memory as their worker last measured it: what a multi-GPU job may borrow."""
    return [record.device for record in _machine(redis, device) if not record.reserved_by]


def machine_memory(redis: Redis, device: Device) -> list[int]:
    """The total memory of every other device of this machine: what the backfill guard judges by
    (claim_next_job's `machine`)."""
    return [record.device.memory_total_bytes for record in _machine(redis, device)]


def could_run_a_job(settings: Settings, worker_name: str, device: Device) -> bool:
    """Whether this idle worker would find a job to take now (its device is not lent out, and a
    queued job fits it, alone or with idle devices)."""
    redis = get_redis(settings.redis_url)
    holder = device_holders(redis, [device.id]).get(device.id)
    if holder not in (None, worker_name):
        return False
    own = device.with_free_memory(free_memory(device))
    others = [other.capacity for other in idle_devices(redis, device)]
    with session_factory(settings.database_url)() as session:
        return has_runnable_job(session, own, others=others, machine=machine_memory(redis, device))


def run_queue(settings: Settings, worker_name: str, device: Device, instance: str | None = None) -> list[int]:
    """Runs queued jobs that fit this device until none is left (or the worker is draining); returns
    the ids it ran. `instance` names this worker's process on the jobs it claims."""
    sessions = session_factory(settings.database_url)
    redis = get_redis(settings.redis_url)
    sweep_orphans(settings, worker_name)
    ran: list[int] = []
    passed_over: set[int] = set()  # jobs whose devices another worker took while this one claimed them
    while not draining.is_set():
        with DeviceLease(redis, worker_name) as lease:
            if not lease.take([device.id]):
                return ran  # the device is lent to another worker's multi-GPU job
            placed = _claim(sessions, redis, worker_name, device, lease, passed_over, instance)
            if placed is None:
                _note_waiting_jobs(sessions, redis)
                return ran
            job, placement = placed
            if job is None:
                continue
            run_job(settings, sessions, redis, job, worker_name, placement, instance)
            lent = [device_id for device_id in lease.device_ids if device_id != device.id]
        ran.append(job.id)
        if lent:  # wake the workers whose devices this job borrowed: jobs may wait for them
            _wake_owners(settings, redis, lent)
    return ran


def _claim(sessions: sessionmaker[Session], redis: Redis, worker_name: str, device: Device, lease: DeviceLease,
           passed_over: set[int], instance: str | None = None) -> tuple[Job | None, Device | None] | None:
    """Claims the next job that fits and reserves the devices it needs; returns it with where it runs
    (this device, or a Placement on several). None: nothing fits (or what fits ranks behind a job on
    several devices that this machine is drained for, claim_next_job); (None, None): the job's devices
    were taken meanwhile, it went back to the queue, look again."""
    own = device.with_free_memory(free_memory(device))
    others = sorted(idle_devices(redis, device), key=lambda other: other.capacity, reverse=True)
    with sessions() as session:
        job = claim_next_job(session, worker_name, own, others=[other.capacity for other in others],
                             exclude=tuple(passed_over), machine=machine_memory(redis, device), instance=instance)
        if job is None:
            return None
        count = max(job.gpus or 1, 1) if job.kind == JobKind.train else 1
        if count == 1:
            return job, own
        borrowed = others[:count - 1]
        if len(borrowed) < count - 1 or not lease.take([other.id for other in borrowed]):
            unclaim_job(session, job.id, worker_name)
            passed_over.add(job.id)
            return None, None
        capacity = multi_device_capacity(own, [other.capacity for other in borrowed], count)
        estimate = job.memory_estimate_bytes
        placement = Placement.of([own, *borrowed],
                                 "ddp" if estimate is None or not capacity or estimate <= capacity else "fsdp")
        job.device = placement.record()
        session.commit()
        return job, placement


def _note_waiting_jobs(sessions: sessionmaker[Session], redis: Redis) -> None:
    """Tells, on the queued jobs that ask for more GPUs than any live machine has, why they wait."""
    largest = largest_machine(live_workers(redis))
    with sessions() as session:
        for job_id in note_waiting_jobs(session, largest):
            job = session.get(Job, job_id)
            publish_queue_event(redis, "waiting", {**job_summary(job), "error": job.error})


def _wake_owners(settings: Settings, redis: Redis, device_ids: list[str]) -> None:
    for record in live_workers(redis):
        if record.device.id in device_ids:
            wake_worker(settings, record.name)


def _launch_command(job: Job, placement: Device) -> tuple[list[str], dict]:
    """The command line and the environment changes that run the job on its device(s)."""
    if not isinstance(placement, Placement):
        return [sys.executable, "-m", PROCESS_MODULES[job.kind], str(job.id)], {}
    visible = ",".join(device.id for device in placement.devices) if placement.kind == "cuda" else ""
    return ([sys.executable, "-m", "lanner.worker.distributed.launcher", str(job.id), "--nproc",
             str(len(placement.devices)), "--strategy", placement.strategy], {"CUDA_VISIBLE_DEVICES": visible})


def placement_line(placement: Device) -> str:
    """Where a job runs, in its log: the host, and the GPU(s) or the CPU."""
    devices = devices_of(placement)
    if placement.kind == "cuda":
        where = (f"GPU {devices[0].index}" if len(devices) == 1 else
                 f"GPUs {', '.join(str(device.index) for device in devices)} ({placement.strategy.upper()})")
    else:
        where = "the CPU" if len(devices) == 1 else f"{len(devices)} CPU slots ({placement.strategy.upper()})"
    return f"Placed on host {placement.host}, {where}"


def run_job(settings: Settings, sessions: sessionmaker[Session], redis: Redis, job: Job,
            worker_name: str, placement: Device, instance: str | None = None) -> JobStatus | None:
    """Runs one claimed job on `placement` (one device, or a Placement on several) and writes its
    final status. Stops the job, and writes nothing, when the job is no longer this worker's (another
    host's sweep took it, thinking this worker lost: docs/multi-host.md); returns None then. When
    the worker drains, the job stops at a checkpoint and goes back to the queue (status queued)."""
    events = JobEvents(job.id, redis, sessions)
    devices = devices_of(placement)
    events.status(JobStatus.running, worker=worker_name, device=placement)
    publish_queue_event(redis, "started", {**job_summary(job), "status": JobStatus.running.value,
                                           "worker": worker_name, "devices": [device.id for device in devices]})
    settings.ensure_dirs()
    log_path = job_log_path(settings, job.id)
    command, env_changes = _launch_command(job, placement)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
           "LANNER_DATA_DIR": str(settings.data_dir), "LANNER_DATABASE_URL": settings.database_url,
           "LANNER_REDIS_URL": settings.redis_url, **env_changes}
    with open(log_path, "ab") as out:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   preexec_fn=_die_with_parent)
    where = (f"{len(devices)} devices ({placement.strategy.upper()})" if isinstance(placement, Placement)
             else placement.name)
    events.log(placement_line(placement))
    events.log(f"{PROCESS_LABELS[job.kind]} process started (pid {process.pid}) on {where}")
    samplers = _samplers(devices, events, process.pid)
    stop_requested_at = None
    cancelled = drained = taken = False
    next_ownership_check = time.monotonic() + OWNERSHIP_CHECK_SECONDS
    try:
        while process.poll() is None:
            time.sleep(POLL_SECONDS)
            if stop_requested_at is None:
                if _cancel_requested(redis, job.id):
                    cancelled = True
                    events.log("Cancel requested: stopping the training process"
                               + (" on every rank" if len(devices) > 1 else ""))
                elif draining.is_set():
                    drained = True
                    events.log(f"The worker {worker_name} is stopping: the job saves a checkpoint and goes back "
                               "to the queue")
                elif time.monotonic() >= next_ownership_check:
                    next_ownership_check = time.monotonic() + OWNERSHIP_CHECK_SECONDS
                    taken = not _still_ours(sessions, job.id, worker_name, instance)
                    if taken:  # at once, without a checkpoint: the job's folder may be another worker's now
                        log.warning("job %s was taken from %s (requeued by a sweep): stopping it", job.id, worker_name)
                        process.kill()
                        process.wait()
                        break
                if cancelled or drained:
                    stop_requested_at = time.monotonic()
                    process.send_signal(signal.SIGTERM)
            elif time.monotonic() - stop_requested_at > (DRAIN_GRACE_SECONDS if drained else CANCEL_GRACE_SECONDS):
                process.kill()  # ranks die with their launcher (PDEATHSIG)
                process.wait()
    finally:
        for sampler in samplers:
            sampler.stop()
    if taken:  # another worker may run it already: its status, stream and checkpoints are no longer ours
        return None
    try:  # before the final status: whoever reads that status finds the flag gone too
        clear_cancel(redis, job.id)
    except Exception:  # Redis away: the flag expires by itself
        log.warning("could not clear the cancel flag of job %s", job.id, exc_info=True)
    stopped_by_drain = drained and process.returncode == -signal.SIGKILL  # past DRAIN_GRACE_SECONDS
    status, error = (None, None) if stopped_by_drain else _outcome(sessions, job.id, process.returncode, cancelled,
                                                                   log_path)
    if status is None:
        _requeue_stopped(settings, sessions, redis, events, job, worker_name)
        status = JobStatus.queued
    elif finish_job(sessions, job.id, worker_name, status, error):
        events.status(status, error=error)
        publish_queue_event(redis, "finished", {**job_summary(job), "status": status.value, "error": error})
    events.flush(FLUSH_SECONDS)
    return status


def _samplers(devices: list[Device], events: JobEvents, pid: int) -> list[DeviceSampler]:
    """One telemetry sampler per GPU of the job; one for the CPU (its slots share one machine)."""
    samplers = []
    for rank, device in enumerate(devices if devices[0].kind == "cuda" else devices[:1]):
        labels = {"device_id": device.id} | ({"rank": rank} if len(devices) > 1 else {})
        sampler = DeviceSampler(device, lambda reading, labels=labels: events.device(reading.model_copy(update=labels)),
                                pid=pid)
        sampler.start()
        samplers.append(sampler)
    return samplers


def _still_ours(sessions: sessionmaker[Session], job_id: int, worker_name: str, instance: str | None) -> bool:
    """Whether the job is still running on this worker (this process of it). The database away: yes,
    keep training."""
    try:
        with sessions() as session:
            row = session.execute(select(Job.status, Job.worker, Job.worker_instance).where(Job.id == job_id)).first()
    except Exception:
        return True
    return (row is not None and row.status == JobStatus.running and row.worker == worker_name
            and (instance is None or row.worker_instance == instance))


def _requeue_stopped(settings: Settings, sessions: sessionmaker[Session], redis: Redis, events: JobEvents, job: Job,
                     worker_name: str) -> None:
    """A job its draining worker stopped at a checkpoint goes back to the queue, to resume from it."""
    with sessions() as session:
        resume_from = checkpoint_on_record(session, settings, job.id)
        if not requeue_stopped_job(session, job.id, worker_name, resume_from):
            return
        requeued = session.get(Job, job.id, populate_existing=True)
        resume_from, summary = requeued.resume_from, job_summary(requeued)
    events.status(JobStatus.queued, error=None, resume_from=resume_from)
    events.log(f"Queued again to {f'resume from {resume_from}' if resume_from else 'start over: no checkpoint yet'}"
               " on the next free worker")
    publish_queue_event(redis, "requeued", summary)
    wake_workers(settings)  # another worker may take it at once


def _cancel_requested(redis: Redis, job_id: int) -> bool:
    try:
        return cancel_requested(redis, job_id)
    except Exception:  # Redis away for a moment: keep training, look again next poll
        return False


def _outcome(sessions: sessionmaker[Session], job_id: int, returncode: int, cancelled: bool,
             log_path: Path) -> tuple[JobStatus | None, str | None]:
    """The job's final status and error; (None, None): stopped by its worker's drain, to be queued again."""
    if returncode == 0:
        return JobStatus.succeeded, None
    if returncode == EXIT_PARTIAL:
        with sessions() as session:
            return JobStatus.succeeded, session.get(Job, job_id).error
    if cancelled:
        return JobStatus.cancelled, None
    if returncode == EXIT_CANCELLED:  # a SIGTERM that was no cancel: the worker itself is stopping
        return None, None
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


def sweep_orphans(settings: Settings, worker_name: str | None = None, alive: str | None = None) -> list[int]:
    """Ends running jobs that nothing runs any more, and publishes their status.

    With worker_name: that worker's running jobs. Called when its dispatch task starts, a moment at
    which the worker (one job at a time) runs nothing, so these are left from a previous life of a
    worker of the same name (killed, then restarted). Without: jobs whose worker has no heartbeat,
    read twice a heartbeat apart so that a Redis restart does not look like every worker dying (and
    never the jobs of `alive`, the worker that sweeps, whose own heartbeat may not be back yet); and
    the queued jobs on several GPUs are told again why they wait (a machine may have gone).
    A training job goes back to the queue to resume from its newest checkpoint on record, or fails
    (claim.sweep_orphaned_jobs says when). Returns the ids of the jobs swept.
    """
    sessions = session_factory(settings.database_url)
    redis = get_redis(settings.redis_url)
    with sessions() as session:
        def resume_point(job: Job) -> str | None:
            return checkpoint_on_record(session, settings, job.id)

        if worker_name:
            swept = sweep_orphaned_jobs(
                session, set(), only_worker=worker_name, resume_point=resume_point,
                reason=f"The worker {worker_name} stopped while running this job (killed or crashed) "
                       f"and has restarted; the job did not finish.")
        else:
            seen = {record.name for record in live_workers(redis)}
            time.sleep(HEARTBEAT_SECONDS * 1.5)
            seen |= {record.name for record in live_workers(redis)}
            swept = sweep_orphaned_jobs(session, seen | {alive}, resume_point=resume_point)
        jobs = [session.get(Job, job_id) for job_id in swept]
        outcomes = [(job.id, job_summary(job), job.status, job.error, job.resume_from, job.requeues, job.step)
                    for job in jobs]
    for job_id, summary, status, error, resume_from, requeues, step in outcomes:
        events = JobEvents(job_id, redis, sessions)
        if status == JobStatus.queued:
            events.status(JobStatus.queued, error=None, resume_from=resume_from, requeues=requeues)
            events.log(f"Its worker was lost at step {step}; queued again ({requeues} of {MAX_REQUEUES} "
                       f"requeues) to {f'resume from {resume_from}' if resume_from else 'start over: no checkpoint yet'}",
                       level="warning")
            publish_queue_event(redis, "requeued", summary)
        else:
            events.status(JobStatus.failed, error=error)
            publish_queue_event(redis, "finished", {**summary, "error": error})
    if not worker_name:
        _note_waiting_jobs(sessions, redis)
    return swept


def checkpoint_on_record(session: Session, settings: Settings, job_id: int) -> str | None:
    """The job's newest complete checkpoint that the database records (and whose folder is still in the
    store). Its Artifact row is written after the trainer finished saving it and it was stored, so a
    folder half-written or half-uploaded when the worker died is never picked."""
    rows = session.execute(select(Artifact).where(Artifact.job_id == job_id, Artifact.kind == ArtifactKind.checkpoint)
                           .order_by(Artifact.id.desc())).scalars()
    store = get_store(settings)
    return next((row.name for row in rows if store.is_folder(row.path)), None)
