"""The job queue lives in the database; Celery only wakes the workers.

The API commits a queued job and calls `wake_workers`; an idle worker's "lanner.dispatch" task then
takes jobs with `claim_next_job` until none fits. A lost wake-up costs nothing but latency: every
worker also looks at the queue when it starts and every few seconds while idle.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timezone
from functools import lru_cache

from redis import Redis
from sqlalchemy import and_, or_, select, true, update
from sqlalchemy.orm import Session

from lanner.core.errors import UserError
from lanner.core.messages.device import Device
from lanner.core.messages.records import StatusChange
from lanner.core.queue import order as queue_order
from lanner.core.queue.order import QUEUE_ORDER
from lanner.core.models import Job, JobKind, JobStatus
from lanner.core.notifications import notify_status
from lanner.core.queue.waiting import WAITING_PREFIX, note_queued_waits, notify_waiting, waiting_reason
from lanner.core.settings import Settings
from lanner.core.spec import MAX_REQUEUES, load_spec

DISPATCH_TASK = "lanner.dispatch"

log = logging.getLogger(__name__)


@lru_cache
def _celery(broker_url: str):
    from celery import Celery

    # Built from the broker URL alone so the API never imports lanner.worker (and torch with it).
    app = Celery("lanner-api", broker=broker_url)
    app.conf.update(broker_connection_retry=False, broker_connection_max_retries=0,
                    broker_transport_options={"max_retries": 1, "socket_timeout": 5, "socket_connect_timeout": 2})
    return app


def wake_workers(settings: Settings) -> bool:
    """Ask an idle worker to look at the queue. Returns False (and logs) when the broker cannot be
    reached; the job stays queued in the database and is taken when a worker next looks."""
    try:
        _celery(settings.redis_url).send_task(DISPATCH_TASK, retry=False)
        return True
    except Exception as error:  # any broker failure: the queue itself is safe in the database
        log.warning("Could not wake the workers through %s: %s", settings.redis_url, error)
        return False


def enqueue(session: Session, redis: Redis, settings: Settings, jobs: list[Job]) -> None:
    """Commits new queued jobs (added to the session and flushed) at once, with the notification of
    those that wait (core.queue.waiting), announces each on the queue stream (`waiting`: the reason
    of a notified one, else null) and wakes the workers."""
    waits = note_queued_waits(session, redis, jobs)
    session.commit()
    for job in jobs:
        queue_order.publish_queue_event(redis, "added", {**queue_order.job_summary(job), "waiting": waits.get(job.id)})
    wake_workers(settings)  # never raises: a job not announced waits in the database, where idle workers look


def cancel_queued(session: Session, redis: Redis, job: Job, by_user_id: int) -> bool:
    """Cancels a job that is still queued, at once, and says so on its stream and the queue's. The
    update applies only while the row is still queued (as a claim's does), so a job a worker claimed,
    or another request cancelled, since it was read is left as it is: False then, with `job` read
    again (the caller asks the worker to stop a claimed one, or answers that it is done)."""
    cancelled = session.execute(
        update(Job).where(Job.id == job.id, Job.status == JobStatus.queued)
        .values(status=JobStatus.cancelled, finished_at=datetime.now(timezone.utc))
        .execution_options(synchronize_session=False)).rowcount
    session.commit()
    session.expire(job)
    if not cancelled:
        return False
    queue_order.publish_job_event(redis, job.id, StatusChange(status=JobStatus.cancelled, by=by_user_id))
    queue_order.publish_queue_event(redis, "cancelled", queue_order.job_summary(job))
    return True


def wake_worker(settings: Settings, worker_name: str) -> bool:
    """Ask one worker, by its Celery name, to look at the queue: through its own queue (Celery's
    worker_direct), so that the wake-up reaches the worker that has room, not any idle one."""
    from celery.utils import worker_direct

    try:
        _celery(settings.redis_url).send_task(DISPATCH_TASK, queue=worker_direct(worker_name), retry=False)
        return True
    except Exception as error:
        log.warning("Could not wake the worker %s through %s: %s", worker_name, settings.redis_url, error)
        return False


def multi_device_capacity(device: Device, others: list[int], count: int) -> int | None:
    """The free memory of the emptiest of `count` devices: this worker's own and the roomiest
    count - 1 of `others` (the free memory of the other devices it could reserve). None when there
    are not that many."""
    if count - 1 > len(others):
        return None
    return min([device.capacity, *sorted(others, reverse=True)[:count - 1]])


def _fits(capacity: int | None, per_device_share: int = 1):
    """The job's estimate fits devices of this capacity (spread over per_device_share devices when
    they shard the model, FSDP). No estimate or no capacity known: it fits."""
    if not capacity:
        return true()
    return or_(Job.memory_estimate_bytes.is_(None), Job.memory_estimate_bytes <= capacity * per_device_share)


def _runnable(device: Device, kinds: tuple[JobKind, ...], others: list[int] = (), exclude: tuple[int, ...] = ()):
    """A queued job this worker could run: one device that fits (gpus 0 or 1), or N devices (this
    one and N - 1 of `others`) that fit it, replicated (DDP) or, failing that, sharded (FSDP)."""
    single = and_(Job.gpus <= 1, _fits(device.capacity))
    fitting = [single]
    for count in range(2, len(others) + 2):
        capacity = multi_device_capacity(device, list(others), count)
        fitting.append(and_(Job.gpus == count, _fits(capacity, count)))
    conditions = [Job.status == JobStatus.queued, Job.kind.in_(kinds), or_(*fitting)]
    if exclude:
        conditions.append(Job.id.not_in(exclude))
    return conditions


_RANK_COLUMNS = (Job.id, Job.priority, Job.queue_order)


def _rank(row) -> tuple:  # QUEUE_ORDER as a tuple: smaller runs first
    return -row.priority, row.queue_order, row.id


def _first_waiting_multi_device_job(session: Session, device: Device, kinds: tuple[JobKind, ...],
                                    machine: list[int]) -> tuple | None:
    """The rank of the first queued job on several devices that this machine could hold with all its
    devices free: this device and N - 1 of `machine` (the total memory of every other device of the
    machine, idle or busy). The backfill guard: this worker takes no job ranked behind it."""
    if not machine:
        return None
    whole = device.with_free_memory(None)
    row = session.execute(select(*_RANK_COLUMNS).where(*_runnable(whole, kinds, machine), Job.gpus >= 2)
                          .order_by(*QUEUE_ORDER).limit(1)).first()
    return _rank(row) if row else None


def has_runnable_job(session: Session, device: Device, kinds: tuple[JobKind, ...] = tuple(JobKind),
                     others: list[int] = (), machine: list[int] = ()) -> bool:
    """Whether a queued job that this device (with `others` and `machine`, see claim_next_job) could
    take is waiting."""
    row = session.execute(select(*_RANK_COLUMNS).where(*_runnable(device, kinds, others))
                          .order_by(*QUEUE_ORDER).limit(1)).first()
    held_for = _first_waiting_multi_device_job(session, device, kinds, machine)
    return row is not None and (held_for is None or _rank(row) <= held_for)


def claim_next_job(session: Session, worker_name: str, device: Device,
                   kinds: tuple[JobKind, ...] = tuple(JobKind), others: list[int] = (),
                   exclude: tuple[int, ...] = (), machine: list[int] = (), instance: str | None = None) -> Job | None:
    """Take the highest-priority queued job (priority desc, queue_order asc, id asc) that fits, mark
    it running on this worker (its host: the device's; `instance`: the worker's process), commit,
    and return it.

    A job fits when its memory estimate fits the device's free memory (`memory_free_bytes`, else its
    total); a job asking for N >= 2 GPUs fits when this device and N - 1 of `others` (the free memory
    of the other idle devices the worker could reserve) can hold it: each a whole replica (DDP) or,
    failing that, a 1/N shard (FSDP). The caller then reserves those devices (worker_registry),
    and gives the job back with `unclaim_job` when another worker was quicker.

    Backfill guard: with `machine` (the total memory of every other device of this machine, idle or
    busy), no job ranked behind the first queued job on several devices that the machine could hold
    is taken, so that the machine's devices drain to that job instead of going to smaller ones.

    Safe when workers race: on PostgreSQL the row is locked with FOR UPDATE SKIP LOCKED, so a second
    worker skips to the next job; elsewhere (SQLite) the update only applies while the row is still
    queued, and a worker that loses the race tries the next candidate.
    """
    postgres = session.get_bind().dialect.name == "postgresql"
    held_for = _first_waiting_multi_device_job(session, device, kinds, machine)
    for _attempt in range(50):
        query = select(*_RANK_COLUMNS).where(*_runnable(device, kinds, others, exclude)).order_by(*QUEUE_ORDER).limit(1)
        if postgres:
            query = query.with_for_update(skip_locked=True)
        row = session.execute(query).first()
        if row is None or (held_for is not None and _rank(row) > held_for):
            session.rollback()
            return None
        job_id = row.id
        taken = session.execute(
            update(Job).where(Job.id == job_id, Job.status == JobStatus.queued)
            .values(status=JobStatus.running, worker=worker_name, host=device.host, worker_instance=instance,
                    device=device.record(), error=None, started_at=datetime.now(timezone.utc), finished_at=None)
            .execution_options(synchronize_session=False)
        ).rowcount
        session.commit()
        if taken == 1:
            job = session.get(Job, job_id, populate_existing=True)
            return job
    return None


def unclaim_job(session: Session, job_id: int, worker_name: str) -> bool:
    """Put a job this worker claimed but could not start (its devices were taken meanwhile) back in
    the queue, where it was. Returns whether it did (False: it is no longer this worker's)."""
    return _back_to_queue(session, job_id, worker_name, host=None, device=None, started_at=None)


def requeue_stopped_job(session: Session, job_id: int, worker_name: str, resume_from: str | None) -> bool:
    """Put a job this worker stopped because the worker itself is stopping (a drain: SIGTERM) back in
    the queue, to resume from `resume_from` (its newest checkpoint, if any) on whichever worker takes
    it next. Not a lost worker: its requeue count stays. Returns whether it did (False: no longer
    this worker's)."""
    return _back_to_queue(session, job_id, worker_name, error=None, finished_at=None,
                          **({"resume_from": resume_from} if resume_from else {}))


def _back_to_queue(session: Session, job_id: int, worker_name: str, **values) -> bool:
    """Queues again, with `values` set too, a job still running on this worker; commits. Whether it did."""
    returned = session.execute(
        update(Job).where(Job.id == job_id, Job.status == JobStatus.running, Job.worker == worker_name)
        .values(status=JobStatus.queued, worker=None, worker_instance=None, **values)
        .execution_options(synchronize_session=False)
    ).rowcount
    session.commit()
    return returned == 1


def note_waiting_jobs(session: Session, largest: int) -> list[int]:
    """Writes on each queued job that asks for more GPUs than the best-equipped live machine has
    (`largest`) why it waits, as its error (a claim clears it), and clears that reason from the jobs
    that now fit. Returns the ids of the jobs whose reason changed."""
    queued = session.execute(select(Job.id, Job.gpus, Job.error).where(
        Job.status == JobStatus.queued, or_(Job.gpus >= 2, Job.error.like(WAITING_PREFIX + "%")))).all()
    changed = []
    for job_id, gpus, error in queued:
        reason = waiting_reason(gpus, largest)
        if reason == error or (error is not None and not error.startswith(WAITING_PREFIX)):
            continue
        noted = session.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.queued)  # not claimed since
                                .values(error=reason).execution_options(synchronize_session=False)).rowcount
        if noted:
            changed.append(job_id)
            if error is None:  # newly waiting (a changed reason is no news)
                notify_waiting(session, session.get(Job, job_id, populate_existing=True), reason)
    session.commit()
    return changed


def sweep_orphaned_jobs(session: Session, live_workers: set[str], reason: str | None = None,
                        only_worker: str | None = None,
                        resume_point: Callable[[Job], str | None] = lambda job: None) -> list[int]:
    """Ends the running jobs whose worker is not alive (or, with only_worker, the running jobs of that
    worker, which has just started and so cannot be running them). A training job whose spec asks
    for it (requeue_on_worker_loss, the default) goes back to the queue, at most MAX_REQUEUES times,
    to resume from the checkpoint resume_point names, or from where it started before it had one;
    any other is marked failed, `reason` (or a sentence naming its worker) saying why. One commit for
    all, so that no reader sees a job that goes back to the queue failed on the way. Returns their ids.

    Every host's workers sweep, at the same time too: each job is swept once. On PostgreSQL the rows
    are locked (FOR UPDATE SKIP LOCKED: a sweeper skips what another is sweeping); everywhere a job
    is only taken while it is still running on the worker it was read with (a conditional UPDATE),
    so a sweeper that read it before another's commit leaves it alone."""
    query = select(Job).where(Job.status == JobStatus.running).order_by(Job.id)
    if only_worker is not None:
        query = query.where(Job.worker == only_worker)
    else:  # the live workers' rows are neither read nor locked
        query = query.where(or_(Job.worker.is_(None), Job.worker.not_in([name for name in live_workers if name])))
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    swept = []
    for job in session.execute(query).scalars().all():  # all first: resume_point may query the session
        if not _take_running(session, job):
            continue
        lost = reason or (f"The worker {job.worker} stopped while running this job (killed or crashed); "
                          "the job did not finish.")
        if not _requeued_on_worker_loss(job):
            _fail(job, lost)
        elif job.requeues >= MAX_REQUEUES:
            kept = resume_point(job)
            _fail(job, f"{lost} Its worker was lost {job.requeues + 1} times: after {MAX_REQUEUES} requeues "
                       f"it is not queued again, in case the job itself takes its worker down. "
                       + (f"Its newest checkpoint, {kept}, is kept: retry from it once the cause is found."
                          if kept else "It has no checkpoint yet."))
        else:
            job.status, job.resume_from, job.worker, job.worker_instance, job.error, job.finished_at = (
                JobStatus.queued, resume_point(job) or job.resume_from, None, None, None, None)
            job.requeues += 1
        swept.append(job.id)
    session.commit()
    return swept


def _take_running(session: Session, job: Job) -> bool:
    """Whether this sweeper has the job to itself: it is still running on the worker (and process) it
    was read with. The UPDATE holds the row until the sweep commits; the sweep then writes its outcome."""
    return session.execute(
        update(Job).where(Job.id == job.id, Job.status == JobStatus.running,
                          Job.worker.is_not_distinct_from(job.worker), Job.worker_instance.is_not_distinct_from(job.worker_instance))
        .values(worker=job.worker).execution_options(synchronize_session=False)
    ).rowcount == 1


def _requeued_on_worker_loss(job: Job) -> bool:
    if job.kind != JobKind.train:
        return False
    try:
        return load_spec(job.config).requeue_on_worker_loss
    except UserError:  # a spec this Lanner cannot read would fail again when it runs
        return False


def _fail(job: Job, error: str) -> None:
    job.status, job.error, job.finished_at = JobStatus.failed, error, datetime.now(timezone.utc)
    notify_status(Session.object_session(job), job)
