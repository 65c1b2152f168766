"""The queue as the database holds it: order, positions, rough start estimates, moves; and the
queue's events on Redis.

Order: priority descending, then queue_order ascending, then id. A new job's place in its priority
band is a fair one (fair_queue_order): owners take turns, so that one person's many jobs (a sweep's
runs) never hold back another's. Moves stay inside a job's priority band (only admins change
priorities), so a member can reorder their own job among the jobs of its band but never jump a
higher-priority one."""
from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any

from redis import Redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from lanner.core.messages.records import RecordEvent
from lanner.core.models import Job, JobStatus
from lanner.core.streams import QUEUE_STREAM, SHARED_STREAM_MAXLEN, job_stream, publish
from lanner.core.worker_registry import live_workers

log = logging.getLogger(__name__)


QUEUE_ORDER = (Job.priority.desc(), Job.queue_order.asc(), Job.id.asc())


def queued_jobs(session: Session) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.status == JobStatus.queued).order_by(*QUEUE_ORDER)))


def next_queue_order(session: Session) -> float:
    last = session.scalar(select(func.max(Job.queue_order)).where(Job.status == JobStatus.queued))
    return (last or 0.0) + 1.0


def fair_queue_order(session: Session, owner_id: int, priority: int) -> float:
    """The queue_order of a new job of this owner in this priority band: owners take turns. A queued
    job's turn is how many jobs of its owner are ahead of it in the band; the new job's is the
    owner's count of queued jobs there, and it goes after the last job whose turn is not later than
    its own. One owner alone queues in arrival order; a job of someone else waits for one job of each
    owner ahead, not for all of them. The band is renumbered when the job goes between two others."""
    band = [job for job in queued_jobs(session) if job.priority == priority]
    turn = sum(1 for job in band if job.owner_id == owner_id)
    seen: dict[int, int] = {}
    after = -1
    for index, job in enumerate(band):
        if seen.get(job.owner_id, 0) <= turn:
            after = index
        seen[job.owner_id] = seen.get(job.owner_id, 0) + 1
    if after == len(band) - 1:
        return next_queue_order(session)
    _renumber(band[:after + 1] + [None] + band[after + 1:])
    return float(after + 2)


def _renumber(band: list[Job | None]) -> None:
    """queue_order 1, 2, ... in the band's order (None: a place kept for a job not yet added)."""
    for order, member in enumerate(band, start=1):
        if member is not None:
            member.queue_order = float(order)


def move(session: Session, job: Job, where: str | None, position: int | None, priority: int | None) -> None:
    """Moves a queued job: up/down/top/bottom inside its band, or to a 1-based queue position
    (clamped to its band); a new priority first puts it at the end of its new band."""
    if priority is not None and priority != job.priority:
        job.priority = priority
        session.flush()
        band = [other for other in queued_jobs(session) if other.priority == priority and other.id != job.id]
        band.append(job)
    else:
        band = [other for other in queued_jobs(session) if other.priority == job.priority]
    index = band.index(job)
    if where == "up":
        target = max(index - 1, 0)
    elif where == "down":
        target = min(index + 1, len(band) - 1)
    elif where == "top":
        target = 0
    elif where == "bottom":
        target = len(band) - 1
    elif position is not None:
        ahead = sum(1 for other in queued_jobs(session) if other.priority > job.priority)
        target = min(max(position - 1 - ahead, 0), len(band) - 1)
    else:
        target = index
    band.remove(job)
    band.insert(target, job)
    _renumber(band)


def _aware(moment: datetime | None) -> datetime | None:
    if moment is not None and moment.tzinfo is None:  # SQLite hands back naive UTC datetimes
        return moment.replace(tzinfo=timezone.utc)
    return moment


def _typical_duration(session: Session) -> timedelta | None:
    recent = session.execute(select(Job.started_at, Job.finished_at).where(
        Job.status == JobStatus.succeeded, Job.started_at.is_not(None), Job.finished_at.is_not(None)
    ).order_by(Job.finished_at.desc()).limit(20)).all()
    if not recent:
        return None
    seconds = [(_aware(end) - _aware(start)).total_seconds() for start, end in recent]
    return timedelta(seconds=sorted(seconds)[len(seconds) // 2])


def queue_view(session: Session, redis: Redis | None) -> dict[int, tuple[int, datetime | None]]:
    """Each queued job's position and a rough start time: the work ahead of it (what running jobs
    still need, judged by their step rate, plus a typical duration per queued job ahead) spread over
    the live workers. None when there is no finished job to judge by."""
    now = datetime.now(timezone.utc)
    typical = _typical_duration(session)
    running_left: list[timedelta] = []
    for job in session.scalars(select(Job).where(Job.status == JobStatus.running)):
        started = _aware(job.started_at)
        if started and job.step and job.total_steps:
            elapsed = now - started
            running_left.append(elapsed * max(job.total_steps - job.step, 0) / job.step)
        elif typical is not None:
            running_left.append(typical)
    try:
        workers = max(len(live_workers(redis)), 1) if redis is not None else 1
    except Exception:  # the estimate is a nicety; Redis trouble must not break the listing
        workers = 1
    view: dict[int, tuple[int, datetime | None]] = {}
    for position, job in enumerate(queued_jobs(session), start=1):
        if typical is None:
            view[job.id] = (position, None)
            continue
        ahead = sum(running_left, timedelta()) + typical * (position - 1)
        view[job.id] = (position, now + ahead / workers)
    return view


def job_summary(job: Job) -> dict[str, Any]:
    return {"job_id": job.id, "owner_id": job.owner_id, "name": job.name, "status": job.status.value,
            "priority": job.priority}


def publish_queue_event(redis: Redis, event_type: str, data: dict[str, Any]) -> None:
    """Queue events: added, started, finished, requeued, reordered, cancelled, deleted, waiting. Best
    effort: the database already holds the truth, and a Redis hiccup must not fail the request that
    changed it."""
    try:
        publish(redis, QUEUE_STREAM, event_type, data, maxlen=SHARED_STREAM_MAXLEN)
    except Exception:
        log.warning("could not publish %s on %s", event_type, QUEUE_STREAM, exc_info=True)


def publish_job_event(redis: Redis, job_id: int, event: RecordEvent) -> None:
    """An event of a job's record published by the API (best effort, as queue events)."""
    try:
        publish(redis, job_stream(job_id), event.TYPE, event.data())
    except Exception:
        log.warning("could not publish %s on job %s", event.TYPE, job_id, exc_info=True)
