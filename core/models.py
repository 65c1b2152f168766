"""ORM models. Every change to them comes with an Alembic migration in migrations/versions/."""
from __future__ import annotations

import enum
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Enum, Float, ForeignKey, Index, Integer, String, Text, false, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from lanner.core.db import Base


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _enum(cls: type[enum.Enum], name: str) -> Enum:
    # Stored as plain strings (no native enum types), so new values need no ALTER TYPE on PostgreSQL.
    return Enum(cls, name=name, native_enum=False, length=24, validate_strings=True)


class Role(str, enum.Enum):
    admin = "admin"
    member = "member"


class JobKind(str, enum.Enum):
    train = "train"
    export = "export"
    chat = "chat"  # a GPU chat session with a training job's model (lanner.worker.chat_process)


class ArtifactKind(enum.StrEnum):  # str() and f-strings give the value: it names folders too
    """What a job's artifact is. A training job saves checkpoints, then an adapter (LoRA/QLoRA) or
    a whole model, its evaluation, and the files of the experiment trackers that write into its folder
    (TensorBoard's event files, W&B's offline run); an export writes an adapter, a merged model, GGUF
    files and a Modelfile."""
    checkpoint = "checkpoint"
    adapter = "adapter"
    model = "model"
    evaluation = "evaluation"
    merged = "merged"
    gguf = "gguf"
    modelfile = "modelfile"
    tensorboard = "tensorboard"
    wandb = "wandb"


class JobStatus(str, enum.Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


# SQLite gives a deleted row's id again unless the table says AUTOINCREMENT: every table whose ids the API
# shows says it (migration 0008), so an id once deleted never names another row.
IDS_NEVER_REUSED = {"sqlite_autoincrement": True}


class User(Base):
    __tablename__ = "users"
    __table_args__ = IDS_NEVER_REUSED

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True, index=True)
    display_name: Mapped[str] = mapped_column(String(200))
    role: Mapped[Role] = mapped_column(Enum(Role, name="user_role", native_enum=False, length=16))
    password_hash: Mapped[str] = mapped_column(String(255))
    is_active: Mapped[bool] = mapped_column(default=True)
    email_notifications: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false(),
                                                      doc="e-mail when one of their jobs finishes, fails or waits")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiToken(Base):
    """A bearer token for scripts; only its SHA-256 is stored, the token itself is shown once."""

    __tablename__ = "api_tokens"
    __table_args__ = IDS_NEVER_REUSED

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Dataset(Base):
    __tablename__ = "datasets"
    __table_args__ = IDS_NEVER_REUSED

    id: Mapped[int] = mapped_column(primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    filename: Mapped[str] = mapped_column(String(255))
    path: Mapped[str] = mapped_column(String(1024), doc="relative to LANNER_DATA_DIR")
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    format: Mapped[str | None] = mapped_column(String(32), doc="alpaca, sharegpt, messages, prompt_completion, text, preference, …")
    rows: Mapped[int] = mapped_column(Integer, default=0)
    usable_rows: Mapped[int] = mapped_column(Integer, default=0)
    report: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Job(Base):
    """A training or export job. The database, not Celery, holds the queue: status, priority, order."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_queue", "status", "priority", "queue_order"), IDS_NEVER_REUSED)

    id: Mapped[int] = mapped_column(primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    kind: Mapped[JobKind] = mapped_column(_enum(JobKind, "job_kind"), default=JobKind.train)
    name: Mapped[str] = mapped_column(String(200))
    method: Mapped[str] = mapped_column(String(24), doc="lora, qlora, full, pretrain, dpo, orpo, kto; export: adapter, merged, gguf")
    model: Mapped[str] = mapped_column(String(1024), doc="hub id, local path, or builtin/SmolLM2-135M-Instruct")
    dataset_id: Mapped[int | None] = mapped_column(ForeignKey("datasets.id", ondelete="SET NULL"), index=True)
    parent_job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"),
                                                      doc="the trained job an export reads, or the job a clone copies")
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"), index=True,
                                                 doc="the sweep this training job is a run of")
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, doc="the validated job spec")
    status: Mapped[JobStatus] = mapped_column(_enum(JobStatus, "job_status"), default=JobStatus.queued, index=True)
    priority: Mapped[int] = mapped_column(Integer, default=0, doc="higher runs first")
    queue_order: Mapped[float] = mapped_column(Float, default=0.0, doc="within a priority, lower runs first")
    memory_estimate_bytes: Mapped[int | None] = mapped_column(BigInteger)
    gpus: Mapped[int] = mapped_column(Integer, default=1, doc="GPUs the job asks for; 0 means CPU")
    worker: Mapped[str | None] = mapped_column(String(255))
    host: Mapped[str | None] = mapped_column(String(255), doc="the worker host it runs or last ran on")
    worker_instance: Mapped[str | None] = mapped_column(
        String(32), doc="the process of its worker that claimed it: a restarted worker of the same name is another")
    device: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    step: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    resume_from: Mapped[str | None] = mapped_column(String(255), doc="checkpoint name to resume from")
    requeues: Mapped[int] = mapped_column(Integer, default=0, server_default="0",
                                          doc="times it went back to the queue after its worker was lost")
    last_event_id: Mapped[str | None] = mapped_column(String(32), doc="the last Redis Stream id persisted")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Sweep(Base):
    """A search over some fields of one spec (lanner.core.sweep): its runs are training jobs
    (Job.sweep_id), queued as any; its status is theirs, derived when read, never stored."""

    __tablename__ = "sweeps"
    __table_args__ = IDS_NEVER_REUSED

    id: Mapped[int] = mapped_column(primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict[str, Any]] = mapped_column(JSON, doc="the SweepSpec: base spec, parameters, budget, metric")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    cancelled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class JobMetric(Base):
    """One optimizer step's metrics (loss, learning_rate, grad_norm, tokens_per_second, …)."""

    __tablename__ = "job_metrics"
    __table_args__ = (Index("ix_job_metrics_job_step", "job_id", "step"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    time: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    values: Mapped[dict[str, Any]] = mapped_column(JSON)


class DeviceSample(Base):
    """One telemetry sample of the device a job ran on (GPU utilisation, memory, temperature, power)."""

    __tablename__ = "device_samples"
    __table_args__ = (Index("ix_device_samples_job_time", "job_id", "time"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    time: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    values: Mapped[dict[str, Any]] = mapped_column(JSON)


class Artifact(Base):
    """A file or folder a job produced: checkpoint, adapter, merged model, GGUF, Modelfile."""

    __tablename__ = "artifacts"
    __table_args__ = IDS_NEVER_REUSED

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[ArtifactKind] = mapped_column(_enum(ArtifactKind, "artifact_kind"))
    name: Mapped[str] = mapped_column(String(255))
    path: Mapped[str] = mapped_column(String(1024), doc="relative to LANNER_DATA_DIR")
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    verification: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Webhook(Base):
    """A user's webhook: job events (lanner.core.notifications) are POSTed to its URL, signed with its
    secret (kept in clear: signing needs it; shown once, at creation)."""

    __tablename__ = "webhooks"
    __table_args__ = IDS_NEVER_REUSED

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(String(2048))
    secret: Mapped[str] = mapped_column(String(128))
    events: Mapped[list[str]] = mapped_column(JSON, doc="finished, failed, waiting")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class NotificationDelivery(Base):
    """One notification to send (a webhook's POST or an e-mail), its attempts and its outcome. Rows
    are written in the transaction that ends or parks the job and sent by the API's sender
    (lanner.backend.notification_sender), so none is lost to a restart."""

    __tablename__ = "notification_deliveries"
    __table_args__ = (Index("ix_notification_deliveries_due", "state", "next_try_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    webhook_id: Mapped[int | None] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"), index=True,
                                                   doc="None: an e-mail")
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    event: Mapped[str] = mapped_column(String(16), doc="finished, failed, waiting or test")
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, doc="the body, the same on every attempt")
    state: Mapped[str] = mapped_column(String(16), default="pending", doc="pending, delivered or failed")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    status_code: Mapped[int | None] = mapped_column(Integer, doc="the last attempt's HTTP status")
    error: Mapped[str | None] = mapped_column(Text, doc="why the last attempt failed")
    next_try_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


TRAINED_KINDS = (ArtifactKind.adapter, ArtifactKind.model)  # what a training job saves: a LoRA/QLoRA adapter, or every weight


def trained_weights(session: Session, job_id: int) -> Artifact | None:
    """A training job's newest adapter or whole model (what export and GPU chat read)."""
    return session.scalars(select(Artifact).where(Artifact.job_id == job_id, Artifact.kind.in_(TRAINED_KINDS))
                           .order_by(Artifact.id.desc())).first()
