"""The before/after evaluation an SFT job writes at its end, as GET /api/jobs/{id}/evaluation shows it."""
from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from lanner.core.errors import UserError
from lanner.core.models import Artifact, ArtifactKind, Job, JobStatus
from lanner.core.settings import Settings
from lanner.core.storage import BadKey, local_copy

SAMPLE_FIELDS = ("prompt", "reference", "base_answer", "tuned_answer", "base_overlap", "tuned_overlap")


def job_evaluation(session: Session, settings: Settings, job_id: int) -> dict[str, Any]:
    """The job's newest evaluation (UserError 404: no job, no evaluation, or its file is gone)."""
    job = session.get(Job, job_id)
    if job is None:
        raise UserError(404, f"No job {job_id}")
    artifact = session.scalars(select(Artifact)
                               .where(Artifact.job_id == job_id, Artifact.kind == ArtifactKind.evaluation)
                               .order_by(Artifact.id.desc())).first()
    if artifact is None:
        raise UserError(404, f"Job {job_id} has no before/after evaluation")
    try:
        path = local_copy(settings, artifact.path)
    except (BadKey, FileNotFoundError):
        path = None
    if path is None or not path.is_file():
        raise UserError(404, f"The evaluation file of job {job_id} is missing")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        return _evaluation_view({"status": "failed", "error": f"The evaluation file is unreadable: {error}"}, job)
    return _evaluation_view(data, job)


def _evaluation_view(data: dict[str, Any], job: Job) -> dict[str, Any]:
    status, error = data.get("status"), data.get("error")
    if status == "running" and job.status != JobStatus.running:
        status, error = "failed", f"The job ended ({job.status.value}) before its evaluation finished."
    samples = [{key: sample.get(key) for key in SAMPLE_FIELDS} for sample in data.get("samples", [])]
    scores = data.get("scores") or {}
    return {"status": status, "error": error, "prompts_from": data.get("prompts_from"),
            "base_eval_loss": data.get("base_eval_loss"),
            "tuned_eval_loss": data.get("tuned_eval_loss"), "samples": samples,
            "scores": {"base_overlap": scores.get("base_overlap", 0.0), "tuned_overlap": scores.get("tuned_overlap", 0.0)}}
