"""GPU chat sessions: chat with a training job's model on a worker's GPU, for models too large or too
slow for the CPU path. The session is a queued job of kind `chat` (a child of the training job, with a
memory estimate like any job), so it takes a device only when the queue gives it one. The worker runs
lanner.worker.chat_process for it, which loads the model on its device with transformers and answers
the questions pushed to Redis until the session idles out or is closed; then the device is free for
the next job. gpu_relay.py relays the socket's questions and the answers' tokens through Redis, in the
messages of lanner.core.messages.chat."""
from __future__ import annotations

from pathlib import Path

from redis import Redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from lanner.backend.deps import may_manage, require_owner_or_admin
from lanner.backend.services import jobs
from lanner.core.errors import UserError
from lanner.core.messages.chat import CONTEXT_TOKENS, CloseSession, push, requests_key
from lanner.core.model_catalog import model_shape
from lanner.core.models import Job, JobKind, JobStatus, User, trained_weights
from lanner.core.queue import order as queue_order
from lanner.core.settings import Settings

OPEN = (JobStatus.queued, JobStatus.running)


def estimate_bytes(model: str, models_dir: Path) -> int | None:
    """Device memory of a session: the model's 16-bit weights, a 16-bit KV cache for CONTEXT_TOKENS
    and CUDA's fixed overhead (an adapter's weights are a rounding error). None: a model of unknown size."""
    from lanner.core.memory_estimate import CUDA_OVERHEAD_BYTES, count_parameters

    shape = model_shape(model, models_dir)
    if shape is None:
        return None
    if "hidden_size" not in shape:  # only the parameter count is known: a KV cache of a tenth of the weights
        return int(shape["parameters"] * 2 * 1.1) + CUDA_OVERHEAD_BYTES
    heads = int(shape.get("num_attention_heads") or 1)
    head_dim = int(shape.get("head_dim") or int(shape["hidden_size"]) // heads)
    kv = 2 * int(shape["num_hidden_layers"]) * CONTEXT_TOKENS * int(shape.get("num_key_value_heads") or heads) * head_dim * 2
    return count_parameters(shape)["total"] * 2 + kv + CUDA_OVERHEAD_BYTES


def open_session(session: Session, user: User, job: Job) -> Job | None:
    """This user's queued or running GPU session with the job's model, if there is one."""
    return session.scalars(select(Job).where(Job.kind == JobKind.chat, Job.parent_job_id == job.id,
                                             Job.owner_id == user.id, Job.status.in_(OPEN))
                           .order_by(Job.id.desc())).first()


def start_session(session: Session, redis: Redis, settings: Settings, user: User, job: Job,
                  idle_seconds: int) -> Job:
    """Queues a GPU session with the training job's model (or returns the user's open one)."""
    if job.status != JobStatus.succeeded:
        raise UserError(409, f"Job {job.id} is {job.status.value}; its model can be chatted with once it has "
                             "succeeded.", code="not_finished")
    if trained_weights(session, job.id) is None:
        raise UserError(409, f"Job {job.id} saved no adapter or model to chat with.", code="no_weights")
    existing = open_session(session, user, job)
    if existing is not None:
        return existing
    return jobs.queue_chat_session(session, redis, settings, user, job, idle_seconds,
                                   estimate_bytes(job.model, settings.models_dir))


def close_session(session: Session, redis: Redis, user: User, session_id: int) -> Job:
    """Ends a GPU chat session: a queued one is cancelled, a running one is asked to close (its process
    finishes the answer it is giving)."""
    chat = session.get(Job, session_id)
    if chat is None or chat.kind != JobKind.chat:
        raise UserError(404, f"No GPU chat session {session_id}")
    require_owner_or_admin(user, chat.owner_id, "close this GPU chat session")
    if chat.status == JobStatus.queued:
        jobs.cancel(session, redis, user, chat)
    elif chat.status == JobStatus.running:
        push(redis, requests_key(chat.id), CloseSession())
    else:
        raise UserError(409, f"GPU chat session {session_id} has already ended ({chat.status.value})")
    return chat


def usable_session(session: Session, user: User, session_id: int, job: Job) -> Job:
    """The GPU session a question names, once it is known to hold the job's model and be the user's."""
    chat = session.get(Job, session_id)
    if chat is None or chat.kind != JobKind.chat or chat.parent_job_id != job.id:
        raise UserError(404, f"There is no GPU session {session_id} with job {job.id}'s model: start one first.",
                        code="no_gpu_session")
    if not may_manage(user, chat.owner_id):
        raise UserError(403, f"GPU session {chat.id} is someone else's: start your own.", code="not_your_gpu_session")
    return chat


def session_state(session: Session, redis: Redis, job_id: int) -> tuple[JobStatus, int | None, str | None]:
    """The session job's status, its place in the queue while queued, and its error once failed."""
    job = session.get(Job, job_id)
    if job is None:
        return JobStatus.cancelled, None, "The session was deleted."
    position = queue_order.queue_view(session, redis).get(job_id, (None, None))[0] \
        if job.status == JobStatus.queued else None
    return job.status, position, job.error
