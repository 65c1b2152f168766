"""A job's events (lanner.core.messages.records): each goes to the job's Redis Stream (live,
replayable) and, where it is part of the run's durable record, to the database (per-step metrics,
device samples, step counters)."""
from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from redis import Redis
from sqlalchemy.orm import Session, sessionmaker

from lanner.core.messages.records import DeviceReading, LogLine, RecordEvent, StatusChange, StepMetrics
from lanner.core.models import DeviceSample, Job, JobMetric, JobStatus
from lanner.core.streams import job_stream, publish
from lanner.worker.distributed.ranks import is_main_process

log = logging.getLogger(__name__)


class JobEvents:
    """One job's events. In a job spread over several processes (torchrun) only rank 0 speaks: the
    other ranks' events are dropped here, so the trainer code needs no rank checks of its own."""

    def __init__(self, job_id: int, redis: Redis, sessions: sessionmaker[Session]):
        self.silent = not is_main_process()
        self.job_id = job_id
        self.redis = redis
        self.sessions = sessions
        self.stream = job_stream(job_id)

    def publish(self, event: RecordEvent) -> str | None:
        """Puts the event on the job's stream; alone, for the live view only (dataset report,
        checkpoint saved, ...). Returns its stream id."""
        if self.silent:
            return None
        try:
            return publish(self.redis, self.stream, event.TYPE, event.data())
        except Exception as error:  # Redis away: the database record still gets written
            log.warning("Could not publish a %s event of job %s: %s", event.TYPE, self.job_id, error)
            return None

    def log(self, message: str, level: str = "info") -> None:
        line = LogLine(level=level, message=message, time=_now())
        getattr(log, line.level)("job %s: %s", self.job_id, message)
        self.publish(line)

    def metric(self, step: int, values: dict[str, Any], total_steps: int | None = None) -> None:
        if self.silent:
            return
        event_id = self.publish(StepMetrics(step=step, **values))
        with self.sessions() as session:
            session.add(JobMetric(job_id=self.job_id, step=step, values=values))
            job = session.get(Job, self.job_id)
            job.step = max(job.step or 0, step)
            if total_steps:
                job.total_steps = total_steps
            if event_id:
                job.last_event_id = event_id
            session.commit()

    def total_steps(self, total: int) -> None:
        if self.silent:
            return
        with self.sessions() as session:
            session.get(Job, self.job_id).total_steps = total
            session.commit()

    def device(self, reading: DeviceReading) -> None:
        if self.silent:
            return
        self.publish(reading)
        with self.sessions() as session:
            session.add(DeviceSample(job_id=self.job_id, values=reading.data()))
            session.commit()

    def status(self, status: JobStatus, error: str | None = None, **details: Any) -> None:
        """Publishes a status change (details: StatusChange's other fields); the database row is
        written by whoever decides the status."""
        self.publish(StatusChange(status=status, error=error, **details))


def finish_job(sessions: sessionmaker[Session], job_id: int, worker: str, status: JobStatus,
               error: str | None) -> bool:
    """Writes the final status, unless the job is no longer running on this worker (a sweep already
    failed it). Returns whether it wrote."""
    with sessions() as session:
        job = session.get(Job, job_id)
        if job is None or job.status != JobStatus.running or job.worker != worker:
            return False
        job.status = status
        job.error = error
        job.finished_at = datetime.now(timezone.utc)
        session.commit()
        return True


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()
