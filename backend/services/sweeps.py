"""Sweeps (lanner.core.sweep): queued as training jobs, one per run, in one commit; read back with
their runs' statuses and the ranking of the runs; cancelled by cancelling the runs still queued."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from fastapi.exceptions import RequestValidationError
from redis import Redis
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from lanner.backend.services import jobs
from lanner.core.errors import UserError
from lanner.core.models import Job, JobMetric, JobStatus, Sweep, User
from lanner.core.queue.claim import cancel_queued, enqueue
from lanner.core.settings import Settings
from lanner.core.sweep import Ranked, SweepSpec, ranking, run_name, runs, sweep_status


def create(session: Session, redis: Redis, settings: Settings, user: User, spec: SweepSpec) -> Sweep:
    """Queues every run of the sweep, or none: a run that would be invalid refuses the whole sweep
    with a 422 naming the parameter (or the base spec's field) that makes it so."""
    made, problems = runs(spec)
    if problems:
        raise RequestValidationError([{**problem, "loc": ("body", *problem["loc"])} for problem in problems])
    name = spec.name or f"sweep of {jobs.default_name(session, spec.base)}"
    sweep = Sweep(owner_id=user.id, name=name[:jobs.NAME_LENGTH], config=spec.model_dump(mode="json"))
    session.add(sweep)
    session.flush()
    try:
        queued = [jobs.training_job(session, redis, settings, user, run.spec, sweep_id=sweep.id,
                                    name=run_name(sweep.name, index, run.assignment))
                  for index, run in enumerate(made, start=1)]
    except RequestValidationError as refused:  # the dataset, the priority, the GPUs: the base spec's fields
        raise RequestValidationError([{**error, "loc": ("body", "base", *error["loc"][1:])}
                                      for error in refused.errors()]) from None
    enqueue(session, redis, settings, queued)
    return sweep


def get_sweep(session: Session, sweep_id: int) -> Sweep:
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        raise UserError(404, f"No sweep {sweep_id}")
    return sweep


def runs_of(session: Session, sweep_ids: list[int]) -> dict[int, list[Job]]:
    """The jobs of each sweep, oldest first."""
    found: dict[int, list[Job]] = {sweep_id: [] for sweep_id in sweep_ids}
    for job in session.scalars(select(Job).where(Job.sweep_id.in_(sweep_ids)).order_by(Job.id)):
        found[job.sweep_id].append(job)
    return found


def status(sweep: Sweep, runs: list[Job]) -> JobStatus:
    return sweep_status([job.status for job in runs], sweep.cancelled_at is not None)


def page_of_sweeps(session: Session, owner_id: int | None, offset: int, limit: int) -> tuple[list[Sweep], int]:
    query = select(Sweep)
    if owner_id is not None:
        query = query.where(Sweep.owner_id == owner_id)
    total = session.scalar(select(func.count()).select_from(query.subquery()))
    return list(session.scalars(query.order_by(Sweep.id.desc()).offset(offset).limit(limit))), total


def cancel(session: Session, redis: Redis, user: User, sweep: Sweep) -> None:
    """Cancels the runs that have not started. Running runs go on (their results rank with the
    others); each may be cancelled from its own page."""
    runs = runs_of(session, [sweep.id])[sweep.id]
    if sweep.cancelled_at is None and all(job.status not in (JobStatus.queued, JobStatus.running) for job in runs):
        raise UserError(409, f"Sweep {sweep.id} has already {status(sweep, runs).value}")
    # a conditional write: of two cancels at once, one sets the time and the other is told so
    claimed = session.execute(update(Sweep).where(Sweep.id == sweep.id, Sweep.cancelled_at.is_(None))
                              .values(cancelled_at=datetime.now(timezone.utc)))
    session.commit()
    if claimed.rowcount != 1:
        raise UserError(409, f"Sweep {sweep.id} is already cancelled")
    session.refresh(sweep)
    for job in runs:
        if job.status == JobStatus.queued:
            cancel_queued(session, redis, job, user.id)


def last_values(session: Session, job_ids: list[int]) -> dict[int, dict[str, float]]:
    """Each job's last logged value of every metric it logged (by step)."""
    last: dict[int, dict[str, float]] = {job_id: {} for job_id in job_ids}
    rows = session.execute(select(JobMetric.job_id, JobMetric.values).where(JobMetric.job_id.in_(job_ids))
                           .order_by(JobMetric.step, JobMetric.id))
    for job_id, values in rows:
        last[job_id].update({key: value for key, value in values.items()
                             if isinstance(value, (int, float)) and not isinstance(value, bool)})
    return last


def ranked(session: Session, runs: list[Job], metric: str, direction: str) -> tuple[list[Ranked], list[str]]:
    """The runs ranked by the metric's last value, and the metrics the runs logged (to rank by)."""
    last = last_values(session, [job.id for job in runs])
    logged = sorted({key for values in last.values() for key in values})
    return ranking([(job.id, job.status, last[job.id].get(metric)) for job in runs], direction), logged


def swept_values(sweep: Sweep, job: Job) -> dict[str, Any]:
    """The values of the swept fields in this run's spec."""
    spec = job.config.get("spec", {})
    values = {}
    for parameter in sweep.config["parameters"]:
        section, name = parameter["field"].split(".")
        values[parameter["field"]] = (spec.get(section) or {}).get(name)
    return values
