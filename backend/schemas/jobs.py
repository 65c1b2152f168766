"""The jobs API's request and response bodies; the spec itself is lanner.core.spec."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lanner.backend.schemas.common import UtcDateTime
from lanner.core.export_spec import ExportSpec
from lanner.core.models import JobKind, JobStatus
from lanner.core.spec import JobSpec, shown_config
from lanner.core.spec_files import MAX_YAML_BYTES


class JobCreate(JobSpec):
    pass


class ExportCreate(ExportSpec):
    pass


class RetryBody(BaseModel):
    resume_from: str | None = Field(default=None, max_length=255,
                                    description="A checkpoint artifact of this job to resume from")


class JobChanges(BaseModel):
    """A clone's changes: any spec fields; nested hyperparameters/lora/preference merge key by key."""
    model_config = ConfigDict(extra="allow")


class QueueMove(BaseModel):
    model_config = ConfigDict(extra="forbid")

    move: Literal["up", "down", "top", "bottom"] | None = None
    position: int | None = Field(default=None, ge=1, le=2**31 - 1, description="1 is the next job to run")
    priority: int | None = Field(default=None, ge=-10, le=10, description="Admins only")

    @model_validator(mode="after")
    def _one_thing(self) -> "QueueMove":
        if self.move is not None and self.position is not None:
            raise ValueError("give either move or position, not both")
        if self.move is None and self.position is None and self.priority is None:
            raise ValueError("give move, position or priority")
        return self


class JobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    owner_id: int
    kind: JobKind
    name: str
    method: str
    model: str
    dataset_id: int | None
    parent_job_id: int | None
    sweep_id: int | None = Field(description="The sweep this job is a run of")
    config: dict[str, Any] = Field(description="A training job's spec; an export or chat job's options")
    status: JobStatus
    priority: int
    memory_estimate_bytes: int | None
    gpus: int
    worker: str | None
    device: dict[str, Any] | None
    step: int
    total_steps: int | None
    error: str | None
    resume_from: str | None
    requeues: int = Field(description="Times it went back to the queue after its worker was lost "
                                      "(requeue_on_worker_loss)")
    created_at: UtcDateTime
    started_at: UtcDateTime | None
    finished_at: UtcDateTime | None
    queue_position: int | None = Field(default=None, description="1 runs next; None unless queued")
    estimated_start: UtcDateTime | None = Field(default=None, description="Rough; None when nothing to go on")
    cancel_requested: bool = False

    @field_validator("config", mode="before")
    @classmethod
    def _shown_config(cls, config: Any) -> Any:
        return shown_config(config)


class JobPage(BaseModel):
    items: list[JobOut]
    total: int
    offset: int
    limit: int


class QueueOut(BaseModel):
    running: list[JobOut]
    queued: list[JobOut] = Field(description="In the order they will run")


class MemoryEstimate(BaseModel):
    model: str
    device: str
    estimate: dict[str, int] | None = Field(description="Bytes by part and total_bytes; None for a model of unknown size")


class ConfigParse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(max_length=MAX_YAML_BYTES, description="A YAML file: a Lanner spec, an Axolotl or a "
                                                             "LLaMA-Factory training config")
    source: Literal["auto", "lanner", "axolotl", "llama-factory"] = "auto"


class ParsedConfig(BaseModel):
    source: Literal["lanner", "axolotl", "llama-factory"]
    valid: bool
    spec: dict[str, Any] = Field(description="Valid: the spec as POST /api/jobs would store it (without dataset_id "
                                             "when the file gives none); else the fields as read, to fill a form")
    errors: list[dict[str, Any]] = Field(description="The spec's errors, as the 422s of POST /api/jobs: "
                                                     "{loc: ['body', field, ...], msg, type}")
    unmapped: list[str] = Field(description="Keys of the file that became nothing in the spec")
    notes: list[str] = Field(description="What to know or do: the dataset to pick, a method that did not map")
