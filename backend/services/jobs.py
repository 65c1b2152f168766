"""Jobs: the one place Job rows are made (training jobs created, cloned or retried; exports of them;
GPU chat sessions with their models) and where a person cancels, reorders or deletes one. Routers
authorise (deps) and shape the answer. A refusal the person can act on is a UserError; one about a
field of the spec is a 422 naming that field (RequestValidationError, as pydantic's own refusals)."""
from __future__ import annotations

import logging
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy import delete as delete_rows
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from lanner.backend.schemas.jobs import QueueMove
from lanner.backend.services import datasets
from lanner.core.db import LIKE_ESCAPE, like_literal
from lanner.core.errors import UserError
from lanner.core.export_spec import ExportSpec
from lanner.core.messages.records import CancelRequested
from lanner.core.messages.signals import cancel_key, request_cancel
from lanner.core.model_catalog import estimate_job_memory
from lanner.core.model_modules import target_modules_problem
from lanner.core.models import (TRAINED_KINDS, Artifact, ArtifactKind, Dataset, Job, JobKind, JobStatus, Role, User,
                                trained_weights)
from lanner.core.queue import order as queue_order
from lanner.core.queue.claim import cancel_queued, enqueue
from lanner.core.queue.waiting import waiting_reason
from lanner.core.settings import Settings
from lanner.core.storage import BadKey, get_store
from lanner.core.spec import REWARD_MODEL_METHODS, JobSpec, load_spec, reward_model_refusal, stored_config
from lanner.core.streams import job_stream
from lanner.core.worker_registry import largest_machine, live_workers
from lanner.inference.availability import require_llama_cpp

log = logging.getLogger(__name__)
NAME_LENGTH = 200  # Job.name's column
PAIRED_PREFERENCE_FORMATS = {"preference"}
UNPAIRED_PREFERENCE_FORMATS = {"preference", "kto", "unpaired_preference"}


def field_error(field: str, message: str) -> RequestValidationError:
    return RequestValidationError([{"loc": ("body", field), "msg": message, "type": "value_error"}])


def validate_spec(data: dict[str, Any]) -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)]
        for error in errors:  # a ValueError in ctx is not JSON; its message is already in msg
            error.pop("ctx", None)
        raise RequestValidationError(errors) from None


def get_job(session: Session, job_id: int, fresh: bool = False) -> Job:
    """The job, or a 404; fresh: read from the database again, not from the session (another request or a
    worker may have changed or deleted it since)."""
    job = session.get(Job, job_id, populate_existing=fresh)
    if job is None:
        raise UserError(404, f"No job {job_id}")
    return job


def page_of_jobs(session: Session, *, statuses: list[JobStatus] | None, owner_id: int | None, method: str | None,
                 dataset_id: int | None, name_contains: str | None, offset: int, limit: int) -> tuple[list[Job], int]:
    """The jobs that match, newest first, and how many match in all."""
    query = select(Job)
    if statuses:
        query = query.where(Job.status.in_(statuses))
    if owner_id is not None:
        query = query.where(Job.owner_id == owner_id)
    if method:
        query = query.where(Job.method == method)
    if dataset_id is not None:
        query = query.where(Job.dataset_id == dataset_id)
    if name_contains:
        query = query.where(Job.name.ilike(f"%{like_literal(name_contains)}%", escape=LIKE_ESCAPE))
    total = session.scalar(select(func.count()).select_from(query.subquery()))
    return list(session.scalars(query.order_by(Job.id.desc()).offset(offset).limit(limit))), total


def running_jobs(session: Session) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.status == JobStatus.running).order_by(Job.started_at)))


def largest_gpu_bytes(redis: Redis) -> int | None:
    """The memory of the largest GPU a live worker owns (a job may go to any, and has the one it gets
    to itself while it runs); None when no GPU worker is live or Redis does not answer."""
    try:
        gpus = [record.device.memory_total_bytes for record in live_workers(redis) if record.device.kind == "cuda"]
    except RedisError:
        return None
    return max(gpus, default=None)


def longest_row(dataset: Dataset | None, model: str) -> int | None:
    """The dataset's longest row (of those its report measured) in `model`'s tokens, when the report
    measured them with that model."""
    if dataset is None:
        return None
    stats = (dataset.report or {}).get("token_stats") or {}
    return stats.get("max") if stats.get("model") == model else None


def reward_model_bases(session: Session, spec: JobSpec) -> list[str]:
    """The base models of the reward jobs a GRPO spec's reward functions name (those that exist and
    read back: the create route refuses the others in words)."""
    bases = []
    for function in spec.grpo.reward_functions if spec.grpo else ():
        job = session.get(Job, function.job_id) if function.kind == "reward_model" else None
        if job is not None and job.kind == JobKind.train:
            try:
                bases.append(load_spec(job.config).model)
            except UserError:
                continue
    return bases


def memory_estimate(spec: JobSpec, settings: Settings, redis: Redis, session: Session,
                    dataset: Dataset | None = None) -> dict[str, int] | None:
    """The device memory the spec needs on its dataset (with the reward models it loads), by part; None
    when it cannot be told."""
    try:
        return estimate_job_memory(spec, settings.models_dir, largest_gpu_bytes(redis) if spec.gpus else None,
                                   longest_row(dataset, spec.model), reward_model_bases(session, spec))
    except Exception:  # an estimate is advice (e.g. a local config.json of an odd shape): never a failure
        log.warning("no memory estimate for %s", spec.model, exc_info=True)
        return None


def _queued_job(session: Session, user: User, name: str, **fields: Any) -> Job:
    """A new queued job of the user's, added to the session at its fair place in its priority band."""
    job = Job(owner_id=user.id, name=name[:NAME_LENGTH], status=JobStatus.queued,
              queue_order=queue_order.fair_queue_order(session, user.id, fields.get("priority", 0)), **fields)
    session.add(job)
    session.flush()  # the next job's fair place counts this one
    return job


def _enqueue(session: Session, redis: Redis, settings: Settings, user: User, name: str, **fields: Any) -> Job:
    """Commits a new job of the user's, queued at its fair place, and wakes the workers."""
    job = _queued_job(session, user, name, **fields)
    enqueue(session, redis, settings, [job])
    return job


def _check_against_database(session: Session, spec: JobSpec, user: User) -> Dataset:
    dataset = session.get(Dataset, spec.dataset_id)
    if dataset is None:
        raise field_error("dataset_id", f"no dataset {spec.dataset_id}")
    fmt = dataset.format or "unknown"
    if spec.method in ("dpo", "orpo", "reward") and fmt not in PAIRED_PREFERENCE_FORMATS:
        raise field_error("dataset_id", f"{spec.method} needs a preference dataset (prompt, chosen, rejected); "
                                        f"dataset {dataset.id} is {fmt}")
    if spec.method == "kto" and fmt not in UNPAIRED_PREFERENCE_FORMATS:
        raise field_error("dataset_id", f"kto needs preference data (prompt, completion, label); "
                                        f"dataset {dataset.id} is {fmt}")
    if spec.method == "grpo" and fmt != "prompt":
        raise field_error("dataset_id", f"grpo needs a prompt dataset (a prompt column, or messages, ending with the user's turn, "
                                        f"and any reference columns); dataset {dataset.id} is {fmt}")
    if dataset.usable_rows <= 0:
        raise field_error("dataset_id", f"dataset {dataset.id} has no usable rows")
    for function in spec.grpo.reward_functions if spec.grpo else ():
        if function.kind == "reward_model":
            _check_reward_model(session, function.job_id)
    if spec.priority > 0 and user.role != Role.admin:
        raise field_error("priority", "only admins may queue above priority 0")
    return dataset


def _check_reward_model(session: Session, job_id: int) -> None:
    """A GRPO reward function's reward model: a finished reward job with its trained model. Every signed-in
    user may read every job and its artifacts, so any user's reward job may be named. Its tokenizer need
    not be the policy's: it reads the prompt and completion as text, with its own tokenizer and template."""
    job = session.get(Job, job_id)
    if job is None or job.kind != JobKind.train:
        raise field_error("grpo", f"reward_model: there is no training job {job_id}")
    if job.method not in REWARD_MODEL_METHODS:
        raise field_error("grpo", f"reward_model: job {job_id} is a {job.method} job, not a reward model (method reward)")
    if job.status != JobStatus.succeeded:
        raise field_error("grpo", f"reward_model: job {job_id} is {job.status.value}; only a succeeded reward job "
                                  "scores completions")
    if trained_weights(session, job_id) is None:
        raise field_error("grpo", f"reward_model: job {job_id}'s trained model was deleted")


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
        raise field_error("gpus", f"asks for {spec.gpus} GPUs on one machine, but the largest machine has "
                                  f"{largest}; ask for at most {largest}, or start workers on a bigger machine")
    return waiting_reason(spec.gpus, largest)


def create(session: Session, redis: Redis, settings: Settings, user: User, spec: JobSpec,
           parent: Job | None = None) -> Job:
    """Queues a training job (a clone or retry names the job it came from, whose checkpoint it may resume from)."""
    job = training_job(session, redis, settings, user, spec, parent_job_id=parent.id if parent else None)
    enqueue(session, redis, settings, [job])
    return job


def _check_resume_point(session: Session, spec: JobSpec, parent_job_id: int | None) -> None:
    if spec.resume_from is None:
        return
    if parent_job_id is None:
        raise field_error("resume_from", "a new job has no checkpoint to resume from: retry a failed or cancelled "
                                         "job with resume_from (or clone one) to continue from one of its checkpoints")
    checkpoint = session.scalar(select(Artifact).where(Artifact.job_id == parent_job_id,
                                                       Artifact.kind == ArtifactKind.checkpoint,
                                                       Artifact.name == spec.resume_from))
    if checkpoint is None:
        raise field_error("resume_from", f"job {parent_job_id} has no checkpoint named {spec.resume_from!r}")


def _check_lora_targets(settings: Settings, spec: JobSpec) -> None:
    """A list of LoRA targets names layers of the model, where its checkpoint is on this machine (the worker's
    PEFT would fail the job on a name that matches none, after its wait in the queue)."""
    if spec.lora is None or isinstance(spec.lora.target_modules, str):
        return
    problem = target_modules_problem(spec.model, spec.lora.target_modules, settings)
    if problem is not None:
        raise field_error("lora", problem)


def default_name(session: Session, spec: JobSpec) -> str:
    dataset = session.get(Dataset, spec.dataset_id)
    return f"{spec.method} {spec.model.rsplit('/', 1)[-1]} on {dataset.name if dataset else spec.dataset_id}"


def training_job(session: Session, redis: Redis, settings: Settings, user: User, spec: JobSpec, *,
                 name: str | None = None, **links: Any) -> Job:
    """A training job of a checked spec, added to the session at its fair place in the queue (not
    committed); `links`: the job it came from (parent_job_id) or the sweep it is a run of (sweep_id)."""
    dataset = _check_against_database(session, spec, user)
    _check_resume_point(session, spec, links.get("parent_job_id"))
    _check_lora_targets(settings, spec)
    waiting = _check_against_machines(redis, spec)
    datasets.refresh_token_stats(session, settings, [dataset])  # measured once its tokenizer is here
    estimate = memory_estimate(spec, settings, redis, session, dataset)
    return _queued_job(session, user, name or spec.name or default_name(session, spec), kind=JobKind.train,
                       method=spec.method, model=spec.model, dataset_id=spec.dataset_id, config=stored_config(spec),
                       memory_estimate_bytes=(estimate or {}).get("total_bytes"), priority=spec.priority,
                       gpus=spec.gpus, resume_from=spec.resume_from, error=waiting, **links)


def _stored_spec(job: Job) -> dict[str, Any]:
    return load_spec(job.config).model_dump(mode="json")


def _require_training_job(job: Job, verb: str) -> None:
    if job.kind != JobKind.train:
        raise UserError(409, f"Job {job.id} is an export; it is not {verb}: export its training job "
                             f"({job.parent_job_id}) again instead")


def retry(session: Session, redis: Redis, settings: Settings, user: User, job: Job, resume_from: str | None) -> Job:
    """Queues a new job with the spec of a failed or cancelled one, optionally resuming from one of its
    checkpoints. A member retrying an admin's urgent job queues it at priority 0."""
    _require_training_job(job, "retried")
    if job.status not in (JobStatus.failed, JobStatus.cancelled):
        raise UserError(409, f"Only failed or cancelled jobs are retried; job {job.id} is {job.status.value} "
                             "(clone it to run it again)")
    # without resume_from it starts over: the failed job's own resume_from named a checkpoint of its parent
    data = {**_stored_spec(job), "resume_from": resume_from or None}
    spec = validate_spec(data)
    if spec.priority > 0 and user.role != Role.admin:
        spec.priority = 0
    return create(session, redis, settings, user, spec, parent=job)


def _merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def clone(session: Session, redis: Redis, settings: Settings, user: User, job: Job, changes: dict[str, Any]) -> Job:
    """Queues a copy of any training job, owned by the user, with the changes merged into its spec."""
    _require_training_job(job, "cloned")
    base = {key: value for key, value in _stored_spec(job).items() if key not in ("name", "resume_from")}
    if changes.get("method") not in (None, base.get("method")):
        # A new method brings its own defaults: the old learning rate, LoRA or preference settings may not fit.
        base.pop("lora", None)
        base.pop("preference", None)
        base.get("hyperparameters", {}).pop("learning_rate", None)
    data = _merge(base, changes)
    if data.get("priority", 0) > 0 and user.role != Role.admin and "priority" not in changes:
        data["priority"] = 0
    return create(session, redis, settings, user, validate_spec(data), parent=job)


def export(session: Session, redis: Redis, settings: Settings, user: User, job: Job, spec: ExportSpec) -> Job:
    """Queues an export of a finished training job. A job that trained every weight has no adapter:
    the adapter is left out unless asked for, which is refused. What needs llama.cpp (k-quants, the
    GGUF checks) is refused in words while it is being built, rather than queued to fail or wait on a
    build that may fail: the adapter, the merged model and f16/bf16/q8_0 unchecked need none."""
    _require_training_job(job, "exported")
    if job.method in REWARD_MODEL_METHODS:
        raise UserError(409, reward_model_refusal(job.id, "a merged model or GGUF file would be a language model "
                                                          "without its score head, and the adapter export is made "
                                                          "for vLLM's LoRA loader, which takes no score head"))
    if job.status != JobStatus.succeeded:
        raise UserError(409, f"Job {job.id} is {job.status.value}; only a finished training job is exported")
    trained = set(session.scalars(select(Artifact.kind).where(Artifact.job_id == job.id,
                                                              Artifact.kind.in_(TRAINED_KINDS))))
    if not trained:
        raise UserError(409, f"Job {job.id} has no adapter and no trained model to export")
    if ArtifactKind.adapter not in trained:
        if spec.adapter and "adapter" in spec.model_fields_set:
            raise field_error("adapter", f"job {job.id} trained every weight ({job.method}), so it has no LoRA "
                                         "adapter: export the merged model or GGUF files")
        spec = spec.model_copy(update={"adapter": False})
    if not (spec.adapter or spec.merged or spec.gguf_types):
        raise field_error("gguf_types", "choose the adapter, the merged model or at least one GGUF type")
    if uses := spec.llama_cpp_uses():
        require_llama_cpp(f"This export ({' and '.join(uses)})", "Meanwhile the adapter, the merged model and "
                          "GGUF f16, bf16 or q8_0 without the check can be exported.")
    return _enqueue(session, redis, settings, user, f"export of {job.name}", kind=JobKind.export, method="export",
                    model=job.model, parent_job_id=job.id, config={"export": spec.model_dump()},
                    priority=job.priority, gpus=min(job.gpus, 1))


def queue_chat_session(session: Session, redis: Redis, settings: Settings, user: User, job: Job,
                       idle_seconds: int, memory_estimate_bytes: int | None) -> Job:
    """Queues a GPU chat session with a training job's model (lanner.backend.playground.gpu_session
    decides when one may start)."""
    return _enqueue(session, redis, settings, user, f"GPU chat with {job.name}", kind=JobKind.chat, method="chat",
                    model=job.model, parent_job_id=job.id, config={"chat": {"idle_seconds": idle_seconds}},
                    priority=0, gpus=1, memory_estimate_bytes=memory_estimate_bytes)


def cancel(session: Session, redis: Redis, user: User, job: Job) -> Job:
    """A queued job is cancelled at once; a running one is asked to stop (its worker stops the run, marks
    the job cancelled and publishes it): it is still running when this returns."""
    job_id = job.id
    if job.status == JobStatus.queued and cancel_queued(session, redis, job, user.id):
        return job
    # not queued, or no longer: a worker claimed it (ask it to stop), another request cancelled it or deleted it
    job = get_job(session, job_id, fresh=True)
    if job.status == JobStatus.running:
        request_cancel(redis, job.id)
        queue_order.publish_job_event(redis, job.id, CancelRequested(by=user.id))
    else:
        raise UserError(409, f"Job {job.id} has already {job.status.value}")
    return job


def move(session: Session, redis: Redis, user: User, job: Job, where: QueueMove) -> Job:
    """Reorders a queued job inside its priority band; only an admin changes its priority."""
    if where.priority is not None and where.priority != job.priority and user.role != Role.admin:
        raise UserError(403, "Only an admin may change a job's priority")
    if job.status != JobStatus.queued:
        raise UserError(409, f"Job {job.id} is {job.status.value}, not queued")
    queue_order.move(session, job, where.move, where.position, where.priority)
    session.commit()
    queue_order.publish_queue_event(redis, "reordered", queue_order.job_summary(job))
    return job


def _delete_files(settings: Settings, job: Job, artifacts: list[Artifact]) -> None:
    store = get_store(settings)
    for key in [f"artifacts/{job.id}", *(artifact.path for artifact in artifacts)]:
        try:
            store.delete(key)
        except BadKey:
            log.warning("job %s: artifact path %s is outside the store; left alone", job.id, key)


def delete(session: Session, redis: Redis, settings: Settings, job: Job) -> None:
    """Deletes a job that is not running, with its metrics, artifacts and their files, and its event stream."""
    was_queued = job.status == JobStatus.queued
    artifacts = list(session.scalars(select(Artifact).where(Artifact.job_id == job.id)))
    summary = queue_order.job_summary(job)
    job_id = job.id
    # only while it is not running: a worker may have claimed it since it was read, and two deletes at
    # once delete it once (the database cascades to its metrics, samples and artifacts)
    deleted = session.execute(delete_rows(Job).where(Job.id == job_id, Job.status != JobStatus.running)
                              .execution_options(synchronize_session=False)).rowcount
    session.commit()
    if not deleted:
        get_job(session, job_id, fresh=True)  # a 404 where another request deleted it
        raise UserError(409, f"Job {job_id} is running: cancel it first")
    session.expunge(job)
    _delete_files(settings, job, artifacts)
    try:
        redis.delete(job_stream(job_id), cancel_key(job_id))
    except Exception:
        log.warning("could not drop the Redis keys of job %s", job_id, exc_info=True)
    if was_queued:
        queue_order.publish_queue_event(redis, "deleted", summary)
