"""Experiment trackers: which ones this studio offers, and a job's runs in them."""
from __future__ import annotations

from pydantic import BaseModel, Field

from lanner.core.spec import Tracker
from lanner.core.trackers import TrackerRun


class TrackerOption(BaseModel):
    name: Tracker
    label: str
    available: bool = Field(description="Whether a job may choose it: MLflow once an admin has set it up")
    detail: str = Field(description="Where its runs go, or what an admin sets to offer it")


class JobTrackerRun(TrackerRun):
    download: str | None = Field(default=None, description="The tracker's files in the job's folder as a tar "
                                                           "stream (TensorBoard's event files, W&B's offline run)")
