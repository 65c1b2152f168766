"""A job's durable history: the per-step metrics and device samples the worker saved in the
database (lanner.core.messages.records: StepValues, DeviceReading), for charts of finished jobs and
for the part of a long run its Redis Stream has trimmed."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, ConfigDict
from sqlalchemy import select
from sqlalchemy.orm import Session

from lanner.backend.deps import current_user, get_db
from lanner.core.messages.records import StepValues
from lanner.core.models import DeviceSample, Job, JobMetric, User
from lanner.backend.schemas.common import SIGNED_IN_ERRORS, PathId, UtcDateTime, errors

router = APIRouter(tags=["jobs"], responses={**SIGNED_IN_ERRORS, **errors(404)})
MAX_PAGE = 10_000


class MetricOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    step: int
    time: UtcDateTime
    values: StepValues  # as the trainer logged them: only the values it had


class SampleOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    time: UtcDateTime
    values: dict[str, Any]  # a DeviceReading's data, as the worker saved it


def _require_job(session: Session, job_id: int) -> None:
    if session.get(Job, job_id) is None:
        raise HTTPException(404, f"No job {job_id}")


@router.get("/api/jobs/{job_id}/metrics", response_model=list[MetricOut], response_model_exclude_unset=True)
def job_metrics(job_id: PathId, after_step: int = Query(default=-1, ge=-1, le=2**31 - 1),
                limit: int = Query(default=2000, ge=1, le=MAX_PAGE), _: User = Depends(current_user),
                session: Session = Depends(get_db)) -> list[JobMetric]:
    """Steps after `after_step`, in order; page on with the last step seen."""
    _require_job(session, job_id)
    return list(session.scalars(select(JobMetric).where(JobMetric.job_id == job_id, JobMetric.step > after_step)
                                .order_by(JobMetric.step, JobMetric.id).limit(limit)))


@router.get("/api/jobs/{job_id}/device-samples", response_model=list[SampleOut])
def job_device_samples(job_id: PathId, after_id: int = Query(default=0, ge=0, le=2**31 - 1),
                       limit: int = Query(default=2000, ge=1, le=MAX_PAGE), _: User = Depends(current_user),
                       session: Session = Depends(get_db)) -> list[DeviceSample]:
    """Samples after `after_id`, oldest first; page on with the last id seen."""
    _require_job(session, job_id)
    return list(session.scalars(select(DeviceSample).where(DeviceSample.job_id == job_id, DeviceSample.id > after_id)
                                .order_by(DeviceSample.id).limit(limit)))
