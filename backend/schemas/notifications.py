"""Webhooks, their deliveries, and one's e-mail notifications."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lanner.backend.schemas.common import UtcDateTime
from lanner.core.notifications import DeliveryState, JobEvent


class WebhookIn(BaseModel):
    url: str = Field(min_length=1, max_length=2048, description="http(s) URL the events are POSTed to")
    events: list[JobEvent] = Field(min_length=1, description="Which of a job's events are sent")

    @field_validator("events")
    @classmethod
    def _once_each(cls, events: list[JobEvent]) -> list[JobEvent]:
        if len(set(events)) != len(events):
            raise ValueError("names an event twice")
        return events


class WebhookOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    url: str
    events: list[JobEvent]
    created_at: UtcDateTime


class CreatedWebhook(WebhookOut):
    secret: str = Field(description="The signing secret: shown this once. X-Lanner-Signature is "
                                    "sha256=<hex HMAC-SHA256 of the raw body with it>")


class DeliveryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    webhook_id: int | None = Field(description="None: an e-mail")
    job_id: int | None
    event: str = Field(description="finished, failed, waiting or test")
    state: DeliveryState
    attempts: int
    status_code: int | None = Field(description="The last attempt's HTTP status")
    error: str | None = Field(description="Why the last attempt failed")
    next_try_at: UtcDateTime | None
    created_at: UtcDateTime
    delivered_at: UtcDateTime | None


class EmailNotifications(BaseModel):
    enabled: bool = Field(description="E-mail me when one of my jobs finishes, fails or waits")


class EmailNotificationsOut(EmailNotifications):
    available: bool = Field(description="Whether an admin set up an SMTP server")
    address: str
