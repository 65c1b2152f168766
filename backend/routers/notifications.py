"""Notifications of one's jobs: webhooks (created with a secret shown once, changed, deleted, tested)
with their delivery log, and the e-mail opt-in. Sending is lanner.backend.notification_sender's."""
from __future__ import annotations

import secrets

from fastapi import APIRouter, Depends, HTTPException, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from lanner.backend.deps import current_user, get_db
from lanner.backend.notification_sender import target_problem
from lanner.backend.schemas.common import SIGNED_IN_ERRORS, PathId, errors
from lanner.backend.schemas.notifications import (CreatedWebhook, DeliveryOut, EmailNotifications,
                                                  EmailNotificationsOut, WebhookIn, WebhookOut)
from lanner.core.models import NotificationDelivery, User, Webhook
from lanner.core.notifications import TEST_EVENT, new_delivery, test_payload
from lanner.core.settings import Settings, get_settings

router = APIRouter(tags=["notifications"], responses=SIGNED_IN_ERRORS)
DELIVERY_LOG_LENGTH = 50
SMTP_NOT_SET_UP = "No SMTP server is set up on this studio: an admin sets LANNER_SMTP_HOST (docs/notifications.md)."


def _checked(body: WebhookIn, settings: Settings) -> WebhookIn:
    problem = target_problem(body.url, settings.webhook_private_targets)
    if problem:
        raise HTTPException(422, [{"loc": ["body", "url"], "msg": f"The URL {problem}", "type": "value_error"}])
    return body


def _own_webhook(session: Session, user: User, webhook_id: int) -> Webhook:
    hook = session.get(Webhook, webhook_id)
    if hook is None or hook.user_id != user.id:  # another's webhook is as invisible as a missing one
        raise HTTPException(404, f"No webhook {webhook_id} of yours")
    return hook


@router.get("/api/webhooks", response_model=list[WebhookOut])
def list_webhooks(user: User = Depends(current_user), session: Session = Depends(get_db)) -> list[Webhook]:
    return list(session.scalars(select(Webhook).where(Webhook.user_id == user.id).order_by(Webhook.id)))


@router.post("/api/webhooks", response_model=CreatedWebhook, status_code=201)
def create_webhook(body: WebhookIn, user: User = Depends(current_user), session: Session = Depends(get_db),
                   settings: Settings = Depends(get_settings)) -> dict:
    _checked(body, settings)
    hook = Webhook(user_id=user.id, url=body.url, secret=secrets.token_hex(32), events=[e.value for e in body.events])
    session.add(hook)
    session.commit()
    return {**WebhookOut.model_validate(hook).model_dump(), "secret": hook.secret}


@router.put("/api/webhooks/{webhook_id}", response_model=WebhookOut, responses=errors(404))
def update_webhook(webhook_id: PathId, body: WebhookIn, user: User = Depends(current_user),
                   session: Session = Depends(get_db), settings: Settings = Depends(get_settings)) -> Webhook:
    hook = _own_webhook(session, user, webhook_id)
    _checked(body, settings)
    hook.url, hook.events = body.url, [e.value for e in body.events]
    session.commit()
    return hook


@router.delete("/api/webhooks/{webhook_id}", status_code=204, responses=errors(404))
def delete_webhook(webhook_id: PathId, user: User = Depends(current_user),
                   session: Session = Depends(get_db)) -> Response:
    session.delete(_own_webhook(session, user, webhook_id))
    session.commit()
    return Response(status_code=204)


@router.get("/api/webhooks/{webhook_id}/deliveries", response_model=list[DeliveryOut], responses=errors(404))
def webhook_deliveries(webhook_id: PathId, user: User = Depends(current_user),
                       session: Session = Depends(get_db)) -> list[NotificationDelivery]:
    """The webhook's newest deliveries first, at most 50."""
    _own_webhook(session, user, webhook_id)
    return list(session.scalars(select(NotificationDelivery).where(NotificationDelivery.webhook_id == webhook_id)
                                .order_by(NotificationDelivery.id.desc()).limit(DELIVERY_LOG_LENGTH)))


@router.post("/api/webhooks/{webhook_id}/test", response_model=DeliveryOut, status_code=202, responses=errors(404))
def test_webhook(webhook_id: PathId, user: User = Depends(current_user),
                 session: Session = Depends(get_db)) -> NotificationDelivery:
    """Queues a "test" delivery (no job): sent within seconds, shown in the delivery log."""
    hook = _own_webhook(session, user, webhook_id)
    delivery = new_delivery(user.id, hook.id, None, TEST_EVENT, test_payload())
    session.add(delivery)
    session.commit()
    return delivery


@router.get("/api/me/notifications", response_model=EmailNotificationsOut)
def email_notifications(user: User = Depends(current_user), settings: Settings = Depends(get_settings)) -> dict:
    return {"enabled": user.email_notifications, "available": bool(settings.smtp_host), "address": user.email}


@router.put("/api/me/notifications", response_model=EmailNotificationsOut)
def set_email_notifications(body: EmailNotifications, user: User = Depends(current_user),
                            session: Session = Depends(get_db), settings: Settings = Depends(get_settings)) -> dict:
    if body.enabled and not settings.smtp_host:
        raise HTTPException(422, [{"loc": ["body", "enabled"], "msg": SMTP_NOT_SET_UP, "type": "value_error"}])
    user.email_notifications = body.enabled
    session.commit()
    return email_notifications(user, settings)
