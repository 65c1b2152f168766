"""The sweeps API's bodies; the sweep itself is lanner.core.sweep."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from lanner.backend.schemas.common import UtcDateTime
from lanner.core.models import JobStatus
from lanner.core.sweep import SweepParameter, SweepSpec


class SweepCreate(SweepSpec):
    pass


class SweepOut(BaseModel):
    id: int
    owner_id: int
    name: str
    status: JobStatus = Field(description="Its runs': queued while all are, running while any is to run or "
                                          "running, then cancelled, succeeded (a run did) or failed")
    strategy: Literal["grid", "random"]
    parameters: list[SweepParameter]
    budget: int
    seed: int
    metric: str
    direction: Literal["minimize", "maximize"]
    base: dict[str, Any] = Field(description="The spec every run starts from")
    job_ids: list[int] = Field(description="Its runs, in the order they were made")
    runs_by_status: dict[JobStatus, int]
    created_at: UtcDateTime
    cancelled_at: UtcDateTime | None


class SweepPage(BaseModel):
    items: list[SweepOut]
    total: int
    offset: int
    limit: int


class RankedRun(BaseModel):
    job_id: int
    name: str
    status: JobStatus
    values: dict[str, Any] = Field(description="The swept fields' values in this run")
    value: float | None = Field(description="The metric's last logged value; None: not logged (yet)")
    rank: int | None = Field(description="1 is the best value; None without a value")
    best: bool = Field(description="The best succeeded run")


class SweepRanking(BaseModel):
    metric: str
    direction: Literal["minimize", "maximize"]
    runs: list[RankedRun] = Field(description="Best first; the runs without a value last")
    metrics: list[str] = Field(description="The metrics the runs have logged, any of which may rank them")
