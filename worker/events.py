"""A job's events (lanner.core.messages.records): each goes to the job's Redis Stream (live,
replayable) and, where it is part of the run's durable record, to the database (per-step metrics,
device samples, step counters)."""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from datetime import datetime, timezone
from typing import Any

from redis import Redis
from sqlalchemy.orm import Session, sessionmaker

from lanner.core.messages.records import DeviceReading, LogLine, RecordEvent, StatusChange, StepMetrics
from lanner.core.models import DeviceSample, Job, JobMetric, JobStatus
from lanner.core.notifications import notify_status
from lanner.core.streams import job_stream, publish
from lanner.worker.distributed.ranks import is_main_process

log = logging.getLogger(__name__)
# How long a process that ends waits for Redis to take the events still waiting (JobEvents.flush).
FLUSH_SECONDS = 10.0


class JobEvents:
    """One job's events. In a job spread over several processes (torchrun) only rank 0 speaks: the
    other ranks' events are dropped here, so the trainer code needs no rank checks of its own.

    While Redis is away (a restart) the events wait here, in order, and go out before the next one
    once it answers again (flush: before the process ends); the database record is written meanwhile.
    A stream id is given at publication, so an event that waited is timed on the stream (and on the
    live charts) when it went out."""

    RETRY_SECONDS = 1.0  # while Redis is away, events are only queued between attempts
    MAX_WAITING = 100_000  # beyond this many waiting events (a long outage), the oldest are dropped

    def __init__(self, job_id: int, redis: Redis, sessions: sessionmaker[Session]):
        self.silent = not is_main_process()
        self.job_id = job_id
        self.redis = redis
        self.sessions = sessions
        self.stream = job_stream(job_id)
        self.waiting: deque[RecordEvent] = deque(maxlen=self.MAX_WAITING)
        self._retry_at = 0.0
        self._away = False
        self._lock = threading.Lock()  # the runner's device samplers publish from threads of their own

    def publish(self, event: RecordEvent) -> str | None:
        """Puts the event on the job's stream, after those still waiting; alone, for the live view only
        (dataset report, checkpoint saved, ...). Returns its stream id, None while it waits."""
        if self.silent:
            return None
        with self._lock:
            self.waiting.append(event)
            return self._publish_waiting()

    def flush(self, wait_seconds: float) -> bool:
        """Publishes the waiting events, trying for up to wait_seconds while Redis is away. Returns
        whether none is left."""
        deadline = time.monotonic() + wait_seconds
        while True:
            with self._lock:
                self._retry_at = 0.0
                self._publish_waiting()
                if not self.waiting:
                    return True
            if time.monotonic() >= deadline:
                log.warning("Redis away: %d events of job %s were not published", len(self.waiting), self.job_id)
                return False
            time.sleep(self.RETRY_SECONDS)

    def _publish_waiting(self) -> str | None:
        if time.monotonic() < self._retry_at:
            return None
        event_id = None
        while self.waiting:
            event = self.waiting[0]
            try:
                event_id = publish(self.redis, self.stream, event.TYPE, event.data())
            except Exception as error:  # Redis away: the database record still gets written
                if not self._away:
                    self._away = True
                    log.warning("Redis away: the events of job %s wait to be published (%s)", self.job_id, error)
                self._retry_at = time.monotonic() + self.RETRY_SECONDS
                return None
            self.waiting.popleft()
        self._away = False
        return event_id

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
        notify_status(session, job)
        session.commit()
        return True


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()
