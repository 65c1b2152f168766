"""Artifacts a job produced."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from lanner.backend.schemas.common import UtcDateTime
from lanner.core.models import ArtifactKind


class ArtifactOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    job_id: int
    kind: ArtifactKind
    name: str
    size_bytes: int
    verification: dict[str, Any] | None
    created_at: UtcDateTime
    files: list[str] | None = None
