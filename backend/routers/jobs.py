"""Jobs and the shared queue. Everyone on the team sees every job; members cancel, delete, retry
and reorder their own, admins anyone's. Creating a job commits it as queued, then wakes the workers."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Body, Depends, HTTPException, Query, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, ValidationError
from redis import Redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from lanner.core.queue import order as queue_order
from lanner.backend.deps import current_user, get_db, per_user, redis_client, require_owner_or_admin
from lanner.core.model_catalog import estimate_job_memory
from lanner.core.models import TRAINED_KINDS, Artifact, ArtifactKind, Dataset, Job, JobKind, JobStatus, Role, User
from lanner.backend.paths import inside
from lanner.core.messages.signals import cancel_key, cancel_requested, request_cancel
from lanner.core.queue.claim import cancel_queued, enqueue, waiting_reason
from lanner.backend.schemas.common import SIGNED_IN_ERRORS, Offset, PathId, QueryId, errors
from lanner.backend.schemas.jobs import JobChanges, JobCreate, JobOut, JobPage, QueueMove
from lanner.core.spec import JobSpec, load_spec, stored_config
from lanner.core.settings import Settings, get_settings
from lanner.core.streams import job_stream
from lanner.core.worker_registry import largest_machine, live_workers

router = APIRouter(tags=["jobs"], responses=SIGNED_IN_ERRORS)
log = logging.getLogger(__name__)
MAX_PAGE = 200
PAIRED_PREFERENCE_FORMATS = {"preference"}
UNPAIRED_PREFERENCE_FORMATS = {"preference", "kto", "unpaired_preference"}


def _field_error(field: str, message: str) -> RequestValidationError:
    return RequestValidationError([{"loc": ("body", field), "msg": message, "type": "value_error"}])


def _validate_spec(data: dict[str, Any]) -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)]
        for error in errors:  # a ValueError in ctx is not JSON; its message is already in msg
            error.pop("ctx", None)
        raise RequestValidationError(errors) from None


def _check_against_database(session: Session, spec: JobSpec, user: User) -> Dataset:
    dataset = session.get(Dataset, spec.dataset_id)
    if dataset is None:
        raise _field_error("dataset_id", f"no dataset {spec.dataset_id}")
    fmt = dataset.format or "unknown"
    if spec.method in ("dpo", "orpo") and fmt not in PAIRED_PREFERENCE_FORMATS:
        raise _field_error("dataset_id", f"{spec.method} needs a preference dataset (prompt, chosen, rejected); "
                                         f"dataset {dataset.id} is {fmt}")
    if spec.method == "kto" and fmt not in UNPAIRED_PREFERENCE_FORMATS:
        raise _field_error("dataset_id", f"kto needs preference data (prompt, completion, label); dataset {dataset.id} is {fmt}")
    if dataset.usable_rows <= 0:
        raise _field_error("dataset_id", f"dataset {dataset.id} has no usable rows")
    if spec.priority > 0 and user.role != Role.admin:
        raise _field_error("priority", "only admins may queue above priority 0")
    return dataset


def _memory_estimate(spec: JobSpec, settings: Settings) -> dict[str, int] | None:
    try:
        return estimate_job_memory(spec, settings.models_dir)
    except Exception:  # an estimate is advice (e.g. a local config.json of an odd shape): never a failure
        log.warning("no memory estimate for %s", spec.model, exc_info=True)
        return None


def _check_against_machines(redis: Redis, spec: JobSpec) -> str | None:
    """A job on more GPUs than the best-equipped live machine has is refused; with no worker live,
    nothing is known of the machines: it is queued with the reason it waits (its error)."""
    if spec.gpus < 2:
        return None
    try:
        largest = largest_machine(live_workers(redis))
    except Exception:  # Redis away: queue it; the workers tell why it waits once they look
        log.warning("could not read the live workers", exc_info=True)
        return None
    if largest and spec.gpus > largest:
        raise _field_error("gpus", f"asks for {spec.gpus} GPUs on one machine, but the largest machine has "
                                   f"{largest}; ask for at most {largest}, or start workers on a bigger machine")
    return waiting_reason(spec.gpus, largest)


def _enqueue(session: Session, redis: Redis, settings: Settings, spec: JobSpec, user: User,
             parent: Job | None = None) -> Job:
    dataset = _check_against_database(session, spec, user)
    waiting = _check_against_machines(redis, spec)
    estimate = _memory_estimate(spec, settings)
    name = spec.name or f"{spec.method} {spec.model.rsplit('/', 1)[-1]} on {dataset.name}"
    job = Job(owner_id=user.id, kind=JobKind.train, name=name[:200], method=spec.method, model=spec.model,
              dataset_id=spec.dataset_id, parent_job_id=parent.id if parent else None,
              config=stored_config(spec), memory_estimate_bytes=(estimate or {}).get("total_bytes"),
              status=JobStatus.queued, priority=spec.priority,
              queue_order=queue_order.next_queue_order(session), gpus=spec.gpus, resume_from=spec.resume_from,
              error=waiting)
    return enqueue(session, redis, settings, job)


def job_out(session: Session, redis: Redis, job: Job, view: dict | None = None) -> JobOut:
    out = JobOut.model_validate(job)
    if job.status == JobStatus.queued:
        view = view if view is not None else queue_order.queue_view(session, redis)
        out.queue_position, out.estimated_start = view.get(job.id, (None, None))
    elif job.status == JobStatus.running:
        try:
            out.cancel_requested = cancel_requested(redis, job.id)
        except Exception:
            log.warning("could not read the cancel flag of job %s", job.id, exc_info=True)
    return out


def _job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise HTTPException(404, f"No job {job_id}")
    return job


@router.post("/api/jobs", response_model=JobOut, status_code=201, dependencies=[per_user("jobs")])
def create_job(body: JobCreate, user: User = Depends(current_user), session: Session = Depends(get_db),
               redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> JobOut:
    job = _enqueue(session, redis, settings, body, user)
    return job_out(session, redis, job)


class MemoryEstimate(BaseModel):
    model: str
    device: str
    estimate: dict[str, int] | None = Field(description="Bytes by part and total_bytes; None for a model of unknown size")


@router.post("/api/jobs/estimate", response_model=MemoryEstimate)
def estimate_job(body: JobCreate, _: User = Depends(current_user),
                 settings: Settings = Depends(get_settings)) -> MemoryEstimate:
    """The device memory a spec would need, without queueing it (the dataset is not checked)."""
    estimate = _memory_estimate(body, settings)
    return MemoryEstimate(model=body.model, device="cuda" if body.gpus else "cpu", estimate=estimate)


@router.get("/api/jobs", response_model=JobPage)
def list_jobs(status: list[JobStatus] | None = Query(default=None), owner_id: QueryId = None,
              mine: bool = False, method: str | None = Query(default=None, max_length=24),
              dataset_id: QueryId = None, q: str | None = Query(default=None, max_length=200),
              offset: Offset = 0, limit: int = Query(default=50, ge=1, le=MAX_PAGE),
              user: User = Depends(current_user), session: Session = Depends(get_db),
              redis: Redis = Depends(redis_client)) -> JobPage:
    """Newest first. `status` may repeat (?status=queued&status=running)."""
    query = select(Job)
    if status:
        query = query.where(Job.status.in_(status))
    if mine:
        owner_id = user.id
    if owner_id is not None:
        query = query.where(Job.owner_id == owner_id)
    if method:
        query = query.where(Job.method == method)
    if dataset_id is not None:
        query = query.where(Job.dataset_id == dataset_id)
    if q:
        query = query.where(Job.name.ilike(f"%{q}%"))
    total = session.scalar(select(func.count()).select_from(query.subquery()))
    jobs = session.scalars(query.order_by(Job.id.desc()).offset(offset).limit(limit))
    view = queue_order.queue_view(session, redis)
    return JobPage(items=[job_out(session, redis, job, view) for job in jobs], total=total, offset=offset, limit=limit)


class QueueOut(BaseModel):
    running: list[JobOut]
    queued: list[JobOut] = Field(description="In the order they will run")


@router.get("/api/queue", response_model=QueueOut)
def queue(_: User = Depends(current_user), session: Session = Depends(get_db),
          redis: Redis = Depends(redis_client)) -> QueueOut:
    view = queue_order.queue_view(session, redis)
    running = session.scalars(select(Job).where(Job.status == JobStatus.running).order_by(Job.started_at))
    return QueueOut(running=[job_out(session, redis, job) for job in running],
                    queued=[job_out(session, redis, job, view) for job in queue_order.queued_jobs(session)])


@router.get("/api/jobs/{job_id}", response_model=JobOut, responses=errors(404))
def get_job(job_id: PathId, _: User = Depends(current_user), session: Session = Depends(get_db),
            redis: Redis = Depends(redis_client)) -> JobOut:
    return job_out(session, redis, _job(session, job_id))


@router.post("/api/jobs/{job_id}/cancel", response_model=JobOut,
             responses={202: {"model": JobOut, "description": "Running: the worker was asked to stop"},
                        **errors(403, 404, 409)})
def cancel_job(job_id: PathId, response: Response, user: User = Depends(current_user),
               session: Session = Depends(get_db), redis: Redis = Depends(redis_client)) -> JobOut:
    """A queued job is cancelled at once. A running one gets the Redis key lanner:job:{id}:cancel
    set to "1"; the worker stops the run, marks the job cancelled and publishes it."""
    job = _job(session, job_id)
    require_owner_or_admin(user, job.owner_id, "cancel this job")
    if job.status == JobStatus.queued:
        cancel_queued(session, redis, job, user.id)
        return job_out(session, redis, job)
    if job.status == JobStatus.running:
        request_cancel(redis, job.id)
        queue_order.publish_job_event(redis, job.id, "cancel_requested", {"by": user.id})
        response.status_code = 202
        return job_out(session, redis, job)
    raise HTTPException(409, f"Job {job_id} has already {job.status.value}")


class RetryBody(BaseModel):
    resume_from: str | None = Field(default=None, max_length=255,
                                    description="A checkpoint artifact of this job to resume from")


@router.post("/api/jobs/{job_id}/retry", response_model=JobOut, status_code=201, dependencies=[per_user("jobs")],
             responses=errors(403, 404, 409))
def retry_job(job_id: PathId, body: RetryBody | None = Body(default=None), user: User = Depends(current_user),
              session: Session = Depends(get_db), redis: Redis = Depends(redis_client),
              settings: Settings = Depends(get_settings)) -> JobOut:
    """Queues a new job with the same spec (a failed or cancelled one), optionally resuming from
    one of its checkpoints."""
    job = _job(session, job_id)
    require_owner_or_admin(user, job.owner_id, "retry this job")
    _require_training_job(job, "retried")
    if job.status not in (JobStatus.failed, JobStatus.cancelled):
        raise HTTPException(409, f"Only failed or cancelled jobs are retried; job {job_id} is {job.status.value} "
                                 "(clone it to run it again)")
    data = load_spec(job.config).model_dump(mode="json")
    if body and body.resume_from:
        checkpoint = session.scalar(select(Artifact).where(Artifact.job_id == job.id, Artifact.kind == ArtifactKind.checkpoint,
                                                           Artifact.name == body.resume_from))
        if checkpoint is None:
            raise _field_error("resume_from", f"job {job_id} has no checkpoint named {body.resume_from!r}")
        data["resume_from"] = body.resume_from
    spec = _validate_spec(data)
    if spec.priority > 0 and user.role != Role.admin:  # a member retrying an admin's urgent job
        spec.priority = 0
    return job_out(session, redis, _enqueue(session, redis, settings, spec, user, parent=job))


def _require_training_job(job: Job, verb: str) -> None:
    if job.kind != JobKind.train:
        raise HTTPException(409, f"Job {job.id} is an export; it is not {verb}: export its training job "
                                 f"({job.parent_job_id}) again instead")


GGUF_TYPES = ("f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q5_k_s", "q5_0", "q5_1", "q4_k_m", "q4_k_s",
              "q4_0", "q4_1", "q3_k_m", "q2_k")


class ExportCreate(BaseModel):
    adapter: bool = Field(default=True, description="The LoRA adapter in PEFT's layout")
    merged: bool = Field(default=True, description="The base model with the adapter merged in, 16-bit safetensors")
    merged_dtype: Literal["bfloat16", "float16"] = "bfloat16"
    gguf_types: list[Literal[GGUF_TYPES]] = Field(default_factory=lambda: ["f16", "q8_0"], max_length=len(GGUF_TYPES),
                                                  description="GGUF files for llama.cpp and Ollama, one per type")
    verify: bool = Field(default=True, description="Check every file against the trained model")


@router.post("/api/jobs/{job_id}/export", response_model=JobOut, status_code=201, dependencies=[per_user("jobs")],
             responses=errors(404, 409))
def export_job(job_id: PathId, body: ExportCreate = Body(default_factory=ExportCreate),
               user: User = Depends(current_user), session: Session = Depends(get_db),
               redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> JobOut:
    """Queues an export of a finished training job: its adapter, a merged model, GGUF files. A job
    that trained every weight (a `model`, no adapter) exports the model in 16 bits and as GGUF files;
    its adapter option is off unless asked for, which is refused."""
    job = _job(session, job_id)
    _require_training_job(job, "exported")
    if job.status != JobStatus.succeeded:
        raise HTTPException(409, f"Job {job_id} is {job.status.value}; only a finished training job is exported")
    trained = set(session.scalars(select(Artifact.kind).where(Artifact.job_id == job.id,
                                                              Artifact.kind.in_(TRAINED_KINDS))))
    if not trained:
        raise HTTPException(409, f"Job {job_id} has no adapter and no trained model to export")
    if ArtifactKind.adapter not in trained:
        if body.adapter and "adapter" in body.model_fields_set:
            raise _field_error("adapter", f"job {job_id} trained every weight ({job.method}), so it has no LoRA "
                                          "adapter: export the merged model or GGUF files")
        body.adapter = False
    if not (body.adapter or body.merged or body.gguf_types):
        raise _field_error("gguf_types", "choose the adapter, the merged model or at least one GGUF type")
    export = Job(owner_id=user.id, kind=JobKind.export, name=f"export of {job.name}"[:200], method="export",
                 model=job.model, parent_job_id=job.id, config={"export": body.model_dump()},
                 status=JobStatus.queued, priority=job.priority, queue_order=queue_order.next_queue_order(session),
                 gpus=min(job.gpus, 1))
    return job_out(session, redis, enqueue(session, redis, settings, export))


def _merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


@router.post("/api/jobs/{job_id}/clone", response_model=JobOut, status_code=201, dependencies=[per_user("jobs")],
             responses=errors(404))
def clone_job(job_id: PathId, changes: JobChanges = Body(default_factory=JobChanges),
              user: User = Depends(current_user), session: Session = Depends(get_db),
              redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> JobOut:
    """Queues a copy of any job, owned by the caller, with the given changes merged in."""
    job = _job(session, job_id)
    _require_training_job(job, "cloned")
    base = {key: value for key, value in load_spec(job.config).model_dump(mode="json").items()
            if key not in ("name", "resume_from")}
    extra = changes.model_extra or {}
    if extra.get("method") not in (None, base.get("method")):
        # A new method brings its own defaults: the old learning rate, LoRA or preference settings may not fit.
        base.pop("lora", None)
        base.pop("preference", None)
        base.get("hyperparameters", {}).pop("learning_rate", None)
    data = _merge(base, extra)
    if data.get("priority", 0) > 0 and user.role != Role.admin and "priority" not in extra:
        data["priority"] = 0
    spec = _validate_spec(data)
    return job_out(session, redis, _enqueue(session, redis, settings, spec, user, parent=job))


@router.post("/api/jobs/{job_id}/move", response_model=JobOut, responses=errors(403, 404, 409))
def move_job(job_id: PathId, body: QueueMove, user: User = Depends(current_user), session: Session = Depends(get_db),
             redis: Redis = Depends(redis_client)) -> JobOut:
    """Reorders a queued job: up, down, top, bottom or a position inside its priority band; admins
    may also change its priority."""
    job = _job(session, job_id)
    require_owner_or_admin(user, job.owner_id, "reorder this job")
    if body.priority is not None and body.priority != job.priority and user.role != Role.admin:
        raise HTTPException(403, "Only an admin may change a job's priority")
    if job.status != JobStatus.queued:
        raise HTTPException(409, f"Job {job_id} is {job.status.value}, not queued")
    queue_order.move(session, job, body.move, body.position, body.priority)
    session.commit()
    queue_order.publish_queue_event(redis, "reordered", queue_order.job_summary(job))
    return job_out(session, redis, job)


def _delete_files(settings: Settings, job: Job, artifacts: list[Artifact]) -> None:
    targets = [settings.artifacts_dir / str(job.id)]
    targets += [settings.data_dir / artifact.path for artifact in artifacts]
    for target in targets:
        if not inside(settings.data_dir, target):
            log.warning("job %s: artifact path %s is outside the data dir; left alone", job.id, target)
            continue
        path = Path(target)
        if path.is_symlink() or path.is_file():
            path.unlink(missing_ok=True)
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


@router.delete("/api/jobs/{job_id}", status_code=204, responses=errors(403, 404, 409))
def delete_job(job_id: PathId, user: User = Depends(current_user), session: Session = Depends(get_db),
               redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> Response:
    """Deletes a job that is not running, with its metrics, artifacts and their files, and its event stream."""
    job = _job(session, job_id)
    require_owner_or_admin(user, job.owner_id, "delete this job")
    if job.status == JobStatus.running:
        raise HTTPException(409, f"Job {job_id} is running: cancel it first")
    was_queued = job.status == JobStatus.queued
    artifacts = list(session.scalars(select(Artifact).where(Artifact.job_id == job.id)))
    summary = queue_order.job_summary(job)
    session.delete(job)
    session.commit()
    _delete_files(settings, job, artifacts)
    try:
        redis.delete(job_stream(job_id), cancel_key(job_id))
    except Exception:
        log.warning("could not drop the Redis keys of job %s", job_id, exc_info=True)
    if was_queued:
        queue_order.publish_queue_event(redis, "deleted", summary)
    return Response(status_code=204)


