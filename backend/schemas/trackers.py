"""Experiment trackers: which ones this studio offers (a job's runs in them: lanner.core.trackers.TrackerRun)."""
from __future__ import annotations

from pydantic import BaseModel, Field

from lanner.core.spec import Tracker


class TrackerOption(BaseModel):
    name: Tracker
    label: str
    available: bool = Field(description="Whether a job may choose it: MLflow once an admin has set it up")
    detail: str = Field(description="Where its runs go, or what an admin sets to offer it")
