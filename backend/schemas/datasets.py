"""Datasets and their validation reports."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class DatasetOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    owner_id: int
    name: str
    filename: str
    size_bytes: int
    format: str | None
    rows: int
    usable_rows: int
    report: dict[str, Any]
    created_at: datetime


class DatasetPage(BaseModel):
    items: list[DatasetOut]
    total: int
    offset: int
    limit: int


class UsageOut(BaseModel):
    used_bytes: int
    quota_bytes: int
    max_upload_bytes: int
