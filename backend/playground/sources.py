"""Which GGUF file answers for each side of a chat: the fine-tuned job's exported GGUF, or the GGUF of
the model it started from. When there is none, `reason` says so in words, with what to do."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from lanner.backend.schemas.playground import ModelFileOut
from lanner.core.default_model import DEFAULT_MODEL_ID, DefaultModelMissing, gguf_path
from lanner.core.errors import UserError
from lanner.core.messages.chat import Side
from lanner.core.models import Artifact, ArtifactKind, Job, JobKind, JobStatus
from lanner.core.settings import Settings
from lanner.core.storage import BadKey, local_copy
from lanner.core.spec import REWARD_MODEL_METHODS, load_spec, reward_model_refusal

# On a CPU, q8_0 answers about twice as fast as f16 and its output is nearly the same (export checks
# its KL against the trained model); f16 next; then whatever other type was exported.
PREFERRED_TYPES = ("q8_0", "f16", "bf16")


class ModelFile(ModelFileOut):
    """A side of the chat: the GGUF that answers, or why there is none; its path stays on the server."""
    path: Path | None = Field(default=None, exclude=True)


def training_job(session: Session, job_id: int) -> Job:
    """The training job whose models the playground chats with (UserError: none, or not a training job)."""
    job = session.get(Job, job_id)
    if job is None:
        raise UserError(404, f"There is no job {job_id}.", code="no_job")
    if job.kind != JobKind.train:
        raise UserError(409, f"Job {job_id} is an export; pick the training job it exported (job {job.parent_job_id}).",
                        code="not_a_training_job")
    if job.method in REWARD_MODEL_METHODS:
        raise UserError(409, reward_model_refusal(job_id, "there is nothing to chat with"), code="reward_model")
    return job


def _type_rank(name: str) -> int:
    stem = name.removesuffix(".gguf").lower()
    for rank, gguf_type in enumerate(PREFERRED_TYPES):
        if stem.endswith(f"-{gguf_type}"):
            return rank
    return len(PREFERRED_TYPES)


def pending_export(session: Session, job: Job) -> Job | None:
    return session.scalars(select(Job).where(Job.parent_job_id == job.id, Job.kind == JobKind.export,
                                             Job.status.in_((JobStatus.queued, JobStatus.running)))
                           .order_by(Job.id.desc())).first()


def tuned_model(session: Session, settings: Settings, job: Job) -> ModelFile:
    """The job's exported GGUF (from its newest export that made one)."""
    if job.status != JobStatus.succeeded:
        return ModelFile(available=False, code="not_finished",
                         reason=f"Job {job.id} is {job.status.value}; its fine-tuned model can be chatted with "
                                "once it has succeeded.")
    found = session.execute(
        select(Artifact).join(Job, Artifact.job_id == Job.id)
        .where(Job.parent_job_id == job.id, Job.kind == JobKind.export, Job.status == JobStatus.succeeded,
               Artifact.kind == ArtifactKind.gguf).order_by(Artifact.id.desc())).scalars().all()
    for artifact in sorted(found, key=lambda a: _type_rank(a.name)):  # stable: newest first within a type
        try:
            path = local_copy(settings, artifact.path).resolve()
        except (BadKey, FileNotFoundError):
            continue
        if path.is_file():
            return ModelFile(available=True, gguf=artifact.name, path=path, artifact_id=artifact.id,
                             size_bytes=path.stat().st_size)
    export = pending_export(session, job)
    if export is not None:
        return ModelFile(available=False, code="export_running",
                         reason=f"Job {job.id}'s export (job {export.id}) is {export.status.value}; "
                                "chat with the fine-tuned model when it has finished.")
    return ModelFile(available=False, code="not_exported",
                     reason=f"Job {job.id} has no GGUF yet: export a GGUF first (POST /api/jobs/{job.id}/export "
                            "with gguf_types [\"q8_0\"] or [\"f16\"], or the Export button).")


def base_model(settings: Settings, model: str) -> ModelFile:
    """The GGUF of the model the job started from: the built-in SmolLM2's shipped file, or a .gguf in
    the model's folder on this machine."""
    if model == DEFAULT_MODEL_ID:
        try:
            path = gguf_path()
        except DefaultModelMissing as error:
            return ModelFile(available=False, code="no_base_gguf", reason=str(error))
        return ModelFile(available=True, gguf=path.name, path=path, size_bytes=path.stat().st_size)
    folder = Path(model).expanduser()
    if not folder.is_absolute():
        folder = settings.models_dir / model
    files = sorted(folder.glob("*.gguf"), key=lambda path: (_type_rank(path.name), path.name)) if folder.is_dir() else []
    if files:
        return ModelFile(available=True, gguf=files[0].name, path=files[0].resolve(),
                         size_bytes=files[0].stat().st_size)
    return ModelFile(available=False, code="no_base_gguf",
                     reason=f"There is no GGUF of the base model {model} on this machine: put one (for example "
                            f"made with llama.cpp's convert_hf_to_gguf.py) in {folder}.")


def model_file(session: Session, settings: Settings, job: Job, side: Side) -> ModelFile:
    return tuned_model(session, settings, job) if side == "tuned" else base_model(settings, job.model)


def describe(session: Session, settings: Settings, job: Job) -> dict[str, Any]:
    """What the Playground page shows for a job: both sides and the export to call when needed."""
    export = pending_export(session, job)
    return {"job_id": job.id, "name": job.name, "model": job.model, "status": job.status.value,
            "finished_at": job.finished_at,
            "custom_chat_template": load_spec(job.config).chat_template is not None,
            "tuned": tuned_model(session, settings, job), "base": base_model(settings, job.model),
            "export_url": f"/api/jobs/{job.id}/export",
            "pending_export": {"job_id": export.id, "status": export.status.value} if export else None}
