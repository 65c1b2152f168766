"""GPU chat sessions: chat with a training job's model on a worker's GPU, for models too large or too
slow for the CPU path. The session is a queued job of kind `chat` (a child of the training job, with a
memory estimate like any job), so it takes a device only when the queue gives it one. The worker runs
lanner.worker.chat_process for it, which loads the model on its device with transformers and answers
the questions pushed to Redis until the session idles out or is closed; then the device is free for
the next job. The WebSocket (lanner.backend.routers.playground) relays questions and tokens.

Redis, per session job: REQUESTS (a list) carries {"type": "generate", "request_id", "side",
"messages", "temperature", "top_p", "max_tokens", "stop"} and {"type": "close"} in; ANSWER (a list per
request) carries the playground's status/token/done/error messages out; STOP asks one answer to end;
READY is set once the model is loaded."""
from __future__ import annotations

from pathlib import Path

from redis import Redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from lanner.core.queue import order as queue_order
from lanner.core.model_catalog import model_shape
from lanner.core.models import Job, JobKind, JobStatus, User, trained_weights
from lanner.backend.playground.sources import NotAvailable
from lanner.core.queue.claim import enqueue
from lanner.core.settings import Settings
from lanner.core.messages.chat import CONTEXT_TOKENS

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
        raise NotAvailable("not_finished", f"Job {job.id} is {job.status.value}; its model can be chatted with "
                                           "once it has succeeded.")
    if trained_weights(session, job.id) is None:
        raise NotAvailable("no_weights", f"Job {job.id} saved no adapter or model to chat with.")
    existing = open_session(session, user, job)
    if existing is not None:
        return existing
    chat = Job(owner_id=user.id, kind=JobKind.chat, name=f"GPU chat with {job.name}"[:200], method="chat",
               model=job.model, parent_job_id=job.id, config={"chat": {"idle_seconds": idle_seconds}},
               status=JobStatus.queued, priority=0, queue_order=queue_order.next_queue_order(session), gpus=1,
               memory_estimate_bytes=estimate_bytes(job.model, settings.models_dir))
    return enqueue(session, redis, settings, chat)
