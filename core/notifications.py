"""Notifications of a user's jobs (docs/notifications.md): when one finishes, fails or waits, a
NotificationDelivery row is added for each of its owner's webhooks that asked for the event, and one
for an e-mail when the owner opted in. They are added in the transaction that ends or parks the job,
so a notification exists exactly when the status does; the API's sender (lanner.backend.notification_sender)
sends them, with retries."""
from __future__ import annotations

import enum
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from lanner.core.models import Job, JobStatus, NotificationDelivery, User, Webhook
from lanner.core.settings import get_settings


class JobEvent(enum.StrEnum):
    finished = "finished"
    failed = "failed"
    waiting = "waiting"


TEST_EVENT = "test"  # a webhook's "Send test" delivery
EVENT_OF_STATUS = {JobStatus.succeeded: JobEvent.finished, JobStatus.failed: JobEvent.failed}

# Retries: the n-th failed attempt waits FIRST_RETRY_SECONDS * 2**(n-1), at most MAX_RETRY_SECONDS;
# after MAX_ATTEMPTS the delivery is failed for good (about 4 h 15 min after the first try).
FIRST_RETRY_SECONDS = 15
MAX_RETRY_SECONDS = 3600
MAX_ATTEMPTS = 10


class DeliveryState(enum.StrEnum):
    pending = "pending"
    delivered = "delivered"
    failed = "failed"


def retry_delay(attempts: int) -> timedelta:
    """How long a delivery waits after its `attempts`-th failed attempt."""
    return timedelta(seconds=min(FIRST_RETRY_SECONDS * 2 ** (attempts - 1), MAX_RETRY_SECONDS))


def test_payload() -> dict[str, Any]:
    return {"event": TEST_EVENT, "occurred_at": _now().isoformat(), "job": None, "links": None}


def job_payload(job: Job, event: str, reason: str | None = None) -> dict[str, Any]:
    """The body of a job's notification: what happened, to which job, why (a waiting job's reason,
    in words), and where to look."""
    settings = get_settings()
    return {"event": event, "occurred_at": _now().isoformat(), "reason": reason,
            "job": {"id": job.id, "name": job.name, "kind": job.kind.value, "method": job.method,
                    "status": job.status.value, "error": job.error},
            "links": {"job": settings.job_page_url(job.id),
                      "artifacts": f"{settings.public_url}/api/jobs/{job.id}/artifacts"}}


def new_delivery(user_id: int, webhook_id: int | None, job_id: int | None, event: str,
                 payload: dict[str, Any]) -> NotificationDelivery:
    """A delivery due at once (webhook_id None: an e-mail to the user)."""
    return NotificationDelivery(user_id=user_id, webhook_id=webhook_id, job_id=job_id, event=event, payload=payload,
                                state=DeliveryState.pending, attempts=0, next_try_at=_now())


def notify_job(session: Session, job: Job, event: JobEvent, reason: str | None = None) -> int:
    """Adds the deliveries of this event of the job to the session (the caller commits them with the
    job's change). Returns how many."""
    payload = job_payload(job, event.value, reason)
    hooks = session.scalars(select(Webhook).where(Webhook.user_id == job.owner_id)).all()
    rows = [new_delivery(job.owner_id, hook.id, job.id, event.value, payload)
            for hook in hooks if event.value in hook.events]
    if session.scalar(select(User.email_notifications).where(User.id == job.owner_id)):
        rows.append(new_delivery(job.owner_id, None, job.id, event.value, payload))
    session.add_all(rows)
    return len(rows)


def notify_status(session: Session, job: Job) -> int:
    """notify_job for a job that has just reached its final status (a cancel notifies nobody: someone
    chose it)."""
    event = EVENT_OF_STATUS.get(job.status)
    return notify_job(session, job, event) if event else 0


def _now() -> datetime:
    return datetime.now(timezone.utc)
