"""Why a queued job waits, in words, and its one "waiting" notification (docs/notifications.md).

Two reasons: the job asks for more GPUs than the best-equipped live machine has (written on the job as
its error, WAITING_PREFIX first, until a claim clears it: `waiting_reason`), or, when it is queued, no
worker is free to start it (no worker running, every worker busy, or more jobs ahead of it than free
workers: `queue_reason`, told once and not stored). Either way the owner is notified once per job,
and once per sweep for a sweep's runs.
"""
from __future__ import annotations

import logging

from redis import Redis
from sqlalchemy import and_, exists, func, or_, select
from sqlalchemy.orm import Session

from lanner.core.messages.device import WorkerRecord
from lanner.core.models import Job, JobStatus, NotificationDelivery
from lanner.core.notifications import JobEvent, notify_job
from lanner.core.worker_registry import live_workers

WAITING_PREFIX = "Waiting: "

log = logging.getLogger(__name__)


def waiting_reason(gpus: int, largest: int) -> str | None:
    """Why a job on `gpus` devices waits when the best-equipped live machine has `largest` (0: no
    worker is live); None when some machine has enough."""
    if gpus < 2 or gpus <= largest:
        return None
    if not largest:
        return f"{WAITING_PREFIX}needs {gpus} GPUs on one machine; no worker is running yet to say what a machine has."
    return f"{WAITING_PREFIX}needs {gpus} GPUs, the largest machine has {largest}."


def queue_reason(ahead: int, workers: int, busy: int) -> str | None:
    """Why a job just queued behind `ahead` others waits when `busy` of the `workers` live workers run a
    job; None when a free worker is left for it."""
    free = workers - busy
    jobs = f"{ahead} job{'s' if ahead != 1 else ''}"
    if workers == 0:
        return f"{WAITING_PREFIX}no worker is running; it starts when one does" + (f", after {jobs} ahead of it." if ahead else ".")
    if free <= 0:
        every = "the one worker is" if workers == 1 else f"all {workers} workers are"
        return f"{WAITING_PREFIX}{every} busy" + (f" and {jobs} {'is' if ahead == 1 else 'are'} ahead of it" if ahead else "") + "; it runs in its turn."
    if ahead >= free:
        return f"{WAITING_PREFIX}{jobs} ahead of it for {free} free worker{'s' if free != 1 else ''}; it runs in its turn."
    return None


def _ahead(session: Session, job: Job) -> int:
    """Queued jobs that run before this one (the queue's order: priority, queue_order, id)."""
    return session.scalar(select(func.count()).select_from(Job).where(
        Job.status == JobStatus.queued, Job.id != job.id,
        or_(Job.priority > job.priority,
            and_(Job.priority == job.priority, or_(Job.queue_order < job.queue_order,
                                                    and_(Job.queue_order == job.queue_order, Job.id < job.id))))))


def why_it_waits(session: Session, job: Job, workers: list[WorkerRecord] | None) -> str | None:
    """Why a job being queued (flushed, not yet committed) cannot start at once, or None. Its own reason
    (more GPUs than any machine has) first; else the queue's, from the live workers (None: unknown, as
    when Redis does not answer; then nothing is said)."""
    if job.error and job.error.startswith(WAITING_PREFIX):
        return job.error
    if workers is None:
        return None
    return queue_reason(_ahead(session, job), len(workers), sum(1 for record in workers if record.reserved_by))


def was_notified_waiting(session: Session, job_id: int) -> bool:
    return session.scalar(select(exists().where(NotificationDelivery.job_id == job_id,
                                                NotificationDelivery.event == JobEvent.waiting.value)))


def notify_waiting(session: Session, job: Job, reason: str) -> int:
    """The job's waiting notification, unless it had one (once per job). The caller commits it."""
    if was_notified_waiting(session, job.id):
        return 0
    return notify_job(session, job, JobEvent.waiting, reason=reason)


def note_queued_waits(session: Session, redis: Redis, jobs: list[Job]) -> dict[int, str]:
    """For jobs being queued (flushed, not committed): notifies the owners of those that wait, once per
    job and once per sweep (its first waiting run stands for the others, its reason saying how many
    wait). Returns {job id: reason} of the notified jobs, for the queue's `added` events."""
    try:
        workers = live_workers(redis)
    except Exception:
        log.warning("could not read the live workers to tell whether new jobs wait", exc_info=True)
        workers = None
    reasons = {job.id: reason for job in jobs if (reason := why_it_waits(session, job, workers))}
    notified: dict[int, str] = {}
    sweeps: set[int] = set()
    for job in jobs:
        reason = reasons.get(job.id)
        if reason is None or job.sweep_id in sweeps:
            continue
        if job.sweep_id is not None:
            sweeps.add(job.sweep_id)
            waiting = sum(1 for run in jobs if run.sweep_id == job.sweep_id and run.id in reasons)
            if waiting > 1:
                reason += f" ({waiting} runs of sweep #{job.sweep_id} wait; this is the one notice for them.)"
        notify_waiting(session, job, reason)
        notified[job.id] = reason
    return notified
