"""Jobs and the shared queue. Everyone on the team sees every job; members cancel, delete, retry
and reorder their own, admins anyone's. What a job becomes is lanner.backend.services.jobs' work."""
from __future__ import annotations

import logging

from typing import Literal

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from redis import Redis
from sqlalchemy.orm import Session

from lanner.backend.deps import current_user, get_db, per_user, redis_client, require_owner_or_admin
from lanner.backend.schemas.common import SIGNED_IN_ERRORS, Offset, PathId, QueryId, errors
from lanner.backend.schemas.jobs import (ConfigParse, ExportCreate, JobChanges, JobCreate, JobOut, JobPage,
                                         MemoryEstimate, ParsedConfig, QueueMove, QueueOut, RetryBody)
from lanner.backend.services import jobs
from lanner.core import spec_files
from lanner.core.errors import UserError
from lanner.core.messages.signals import cancel_requested
from lanner.core.models import Dataset, Job, JobKind, JobStatus, User
from lanner.core.queue import order as queue_order
from lanner.core.settings import Settings, get_settings
from lanner.core.spec import load_spec

router = APIRouter(tags=["jobs"], responses=SIGNED_IN_ERRORS)
log = logging.getLogger(__name__)
MAX_PAGE = 200


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


@router.post("/api/jobs", response_model=JobOut, status_code=201, dependencies=[per_user("jobs")])
def create_job(body: JobCreate, user: User = Depends(current_user), session: Session = Depends(get_db),
               redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> JobOut:
    return job_out(session, redis, jobs.create(session, redis, settings, user, body))


@router.post("/api/jobs/estimate", response_model=MemoryEstimate)
def estimate_job(body: JobCreate, _: User = Depends(current_user), session: Session = Depends(get_db),
                 redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> MemoryEstimate:
    """The device memory a spec would need, without queueing it (the dataset is not checked; when it
    exists and its report measured its rows with the spec's model, its longest row sizes a batch)."""
    return MemoryEstimate(model=body.model, device="cuda" if body.gpus else "cpu",
                          estimate=jobs.memory_estimate(body, settings, redis, session,
                                                               session.get(Dataset, body.dataset_id)))


@router.post("/api/jobs/config/parse", response_model=ParsedConfig, responses=errors(422))
def parse_config(body: ConfigParse, _: User = Depends(current_user)) -> ParsedConfig:
    """Reads a YAML file as a spec (Lanner's own, or an Axolotl or LLaMA-Factory config: the fields that
    map) and validates it; queues nothing. A file that is not YAML, or over the limits, is a 422 in words."""
    try:
        parsed = spec_files.parse(body.text, body.source)
    except spec_files.SpecFileError as error:
        raise UserError(422, str(error)) from None
    spec, problems = spec_files.validate(parsed)
    return ParsedConfig(source=parsed.source, valid=not problems, spec=spec or parsed.spec, errors=problems,
                        unmapped=parsed.unmapped, notes=parsed.notes)


@router.get("/api/jobs/{job_id}/config", response_class=Response, responses={
    200: {"content": {"application/yaml": {"schema": {"type": "object"}}, "text/plain": {"schema": {"type": "string"}}},
          "description": "The spec as a YAML file, or as a shell command that queues it again"}, **errors(404, 409)})
def job_config(job_id: PathId, request: Request, format: Literal["yaml", "command"] = "yaml",
               _: User = Depends(current_user), session: Session = Depends(get_db)) -> Response:
    """A training job's spec as a Lanner YAML file (`lanner submit`, `lanner train` and the new-job
    page read it), or as a command line that writes that file and submits it to this studio. Without
    `resume_from`: a job queued from it starts from the beginning."""
    job = jobs.get_job(session, job_id)
    if job.kind != JobKind.train:
        raise UserError(409, f"Job {job_id} is an {job.kind} job; only a training job has a spec")
    # resume_from names a checkpoint of this job's family; a job queued from the file starts afresh (as a clone)
    spec = load_spec(job.config).model_dump(mode="json", exclude={"resume_from"})
    name = f"job-{job.id}.yaml"
    if format == "yaml":
        return Response(spec_files.dump_yaml(spec), media_type="application/yaml",
                        headers={"Content-Disposition": f'attachment; filename="{name}"'})
    return Response(spec_files.command_line(spec, str(request.base_url).rstrip("/"), name), media_type="text/plain",
                    headers={"Content-Disposition": f'attachment; filename="job-{job.id}.sh"'})


@router.get("/api/jobs", response_model=JobPage)
def list_jobs(status: list[JobStatus] | None = Query(default=None), owner_id: QueryId = None,
              mine: bool = False, method: str | None = Query(default=None, max_length=24),
              dataset_id: QueryId = None, q: str | None = Query(default=None, max_length=200),
              offset: Offset = 0, limit: int = Query(default=50, ge=1, le=MAX_PAGE),
              user: User = Depends(current_user), session: Session = Depends(get_db),
              redis: Redis = Depends(redis_client)) -> JobPage:
    """Newest first. `status` may repeat (?status=queued&status=running)."""
    page, total = jobs.page_of_jobs(session, statuses=status, owner_id=user.id if mine else owner_id, method=method,
                                    dataset_id=dataset_id, name_contains=q, offset=offset, limit=limit)
    view = queue_order.queue_view(session, redis)
    return JobPage(items=[job_out(session, redis, job, view) for job in page], total=total, offset=offset, limit=limit)


@router.get("/api/queue", response_model=QueueOut)
def queue(_: User = Depends(current_user), session: Session = Depends(get_db),
          redis: Redis = Depends(redis_client)) -> QueueOut:
    view = queue_order.queue_view(session, redis)
    return QueueOut(running=[job_out(session, redis, job) for job in jobs.running_jobs(session)],
                    queued=[job_out(session, redis, job, view) for job in queue_order.queued_jobs(session)])


@router.get("/api/jobs/{job_id}", response_model=JobOut, responses=errors(404))
def get_job(job_id: PathId, _: User = Depends(current_user), session: Session = Depends(get_db),
            redis: Redis = Depends(redis_client)) -> JobOut:
    return job_out(session, redis, jobs.get_job(session, job_id))


@router.post("/api/jobs/{job_id}/cancel", response_model=JobOut,
             responses={202: {"model": JobOut, "description": "Running: the worker was asked to stop"},
                        **errors(403, 404, 409)})
def cancel_job(job_id: PathId, response: Response, user: User = Depends(current_user),
               session: Session = Depends(get_db), redis: Redis = Depends(redis_client)) -> JobOut:
    """A queued job is cancelled at once. A running one gets the Redis key lanner:job:{id}:cancel
    set to "1"; the worker stops the run, marks the job cancelled and publishes it."""
    job = jobs.get_job(session, job_id)
    require_owner_or_admin(user, job.owner_id, "cancel this job")
    jobs.cancel(session, redis, user, job)
    if job.status == JobStatus.running:
        response.status_code = 202
    return job_out(session, redis, job)


@router.post("/api/jobs/{job_id}/retry", response_model=JobOut, status_code=201, dependencies=[per_user("jobs")],
             responses=errors(403, 404, 409))
def retry_job(job_id: PathId, body: RetryBody | None = Body(default=None), user: User = Depends(current_user),
              session: Session = Depends(get_db), redis: Redis = Depends(redis_client),
              settings: Settings = Depends(get_settings)) -> JobOut:
    """Queues a new job with the same spec (a failed or cancelled one), optionally resuming from
    one of its checkpoints."""
    job = jobs.get_job(session, job_id)
    require_owner_or_admin(user, job.owner_id, "retry this job")
    retried = jobs.retry(session, redis, settings, user, job, body.resume_from if body else None)
    return job_out(session, redis, retried)


@router.post("/api/jobs/{job_id}/export", response_model=JobOut, status_code=201, dependencies=[per_user("jobs")],
             responses=errors(404, 409))
def export_job(job_id: PathId, body: ExportCreate = Body(default_factory=ExportCreate),
               user: User = Depends(current_user), session: Session = Depends(get_db),
               redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> JobOut:
    """Queues an export of a finished training job: its adapter, a merged model, GGUF files. A job
    that trained every weight (a `model`, no adapter) exports the model in 16 bits and as GGUF files;
    its adapter option is off unless asked for, which is refused."""
    export = jobs.export(session, redis, settings, user, jobs.get_job(session, job_id), body)
    return job_out(session, redis, export)


@router.post("/api/jobs/{job_id}/clone", response_model=JobOut, status_code=201, dependencies=[per_user("jobs")],
             responses=errors(404))
def clone_job(job_id: PathId, changes: JobChanges = Body(default_factory=JobChanges),
              user: User = Depends(current_user), session: Session = Depends(get_db),
              redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> JobOut:
    """Queues a copy of any job, owned by the caller, with the given changes merged in."""
    clone = jobs.clone(session, redis, settings, user, jobs.get_job(session, job_id), changes.model_extra or {})
    return job_out(session, redis, clone)


@router.post("/api/jobs/{job_id}/move", response_model=JobOut, responses=errors(403, 404, 409))
def move_job(job_id: PathId, body: QueueMove, user: User = Depends(current_user), session: Session = Depends(get_db),
             redis: Redis = Depends(redis_client)) -> JobOut:
    """Reorders a queued job: up, down, top, bottom or a position inside its priority band; admins
    may also change its priority."""
    job = jobs.get_job(session, job_id)
    require_owner_or_admin(user, job.owner_id, "reorder this job")
    return job_out(session, redis, jobs.move(session, redis, user, job, body))


@router.delete("/api/jobs/{job_id}", status_code=204, responses=errors(403, 404, 409))
def delete_job(job_id: PathId, user: User = Depends(current_user), session: Session = Depends(get_db),
               redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> Response:
    """Deletes a job that is not running, with its metrics, artifacts and their files, and its event stream."""
    job = jobs.get_job(session, job_id)
    require_owner_or_admin(user, job.owner_id, "delete this job")
    jobs.delete(session, redis, settings, job)
    return Response(status_code=204)
