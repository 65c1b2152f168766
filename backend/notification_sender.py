"""Sends the notifications (lanner.core.notifications): webhooks' signed POSTs and e-mail, with retries.

The deliveries are database rows, written with the job's status; a thread of the API process sends
the due ones every few seconds. The API, not a worker, sends them: a worker's only Celery slot is
taken by a job for hours, and a job may end (cancel of a queued job, a swept worker) with no worker
alive; the rows outlive a restart of either, and the sender takes up the pending ones when the API
is back. A row is claimed by moving its next try ahead before it is sent, so several API processes
never send one twice at once.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import smtplib
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from email.message import EmailMessage
from urllib.parse import urlsplit

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from lanner.core.db import session_factory
from lanner.core.models import NotificationDelivery, User, Webhook
from lanner.core.notifications import MAX_ATTEMPTS, DeliveryState, retry_delay
from lanner.core.settings import Settings

SIGNATURE_HEADER = "X-Lanner-Signature"
TIMESTAMP_HEADER = "X-Lanner-Timestamp"
EVENT_HEADER = "X-Lanner-Event"
TIMEOUT_SECONDS = 10.0
LOOK_SECONDS = 2.0  # how often the sender looks for due deliveries
CLAIM_SECONDS = 60  # a claimed delivery is due again after this if its sender died while sending
BATCH = 20

log = logging.getLogger(__name__)


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def target_problem(url: str, allow_private: bool) -> str | None:
    """Why a webhook may not POST to this URL (in words), or None. Not http(s), no host, a host that
    does not resolve, or (unless an admin allows them) one that resolves to a private, loopback,
    link-local or otherwise non-public address."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:  # a bracketed host that is no IPv6 address, a port that is no number...
        return f"is not a valid URL ({error})"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if not parts.hostname:
        return "has no host"
    try:
        infos = socket.getaddrinfo(parts.hostname, port or (443 if parts.scheme == "https" else 80),
                                   proto=socket.IPPROTO_TCP)
    except (ValueError, OSError) as error:
        return f"cannot be reached: {parts.hostname} does not resolve ({error})"
    if allow_private:
        return None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if not address.is_global:
            return (f"points at {address}, a private address; an admin allows those with "
                    f"LANNER_WEBHOOK_PRIVATE_TARGETS=true")
    return None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # a redirect could lead to an address the check refused
        return None


_opener = urllib.request.build_opener(_NoRedirects)


def post_webhook(hook: Webhook, delivery: NotificationDelivery, settings: Settings) -> tuple[int | None, str | None]:
    """One attempt: (HTTP status, None) on a 2xx answer, else (status or None, why in words)."""
    problem = target_problem(hook.url, settings.webhook_private_targets)
    if problem:
        return None, f"The URL {problem}."
    body = json.dumps(delivery.payload, separators=(",", ":")).encode()
    request = urllib.request.Request(hook.url, data=body, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "Lanner-Webhook",
        SIGNATURE_HEADER: sign(hook.secret, body), TIMESTAMP_HEADER: str(int(time.time())),
        EVENT_HEADER: delivery.event})
    try:
        with _opener.open(request, timeout=TIMEOUT_SECONDS) as response:
            return response.status, None
    except urllib.error.HTTPError as error:
        reason = "a redirect, which is not followed" if 300 <= error.code < 400 else error.reason
        return error.code, f"The receiver answered {error.code} ({reason})."
    except (urllib.error.URLError, OSError) as error:
        return None, f"No answer from {urlsplit(hook.url).netloc}: {getattr(error, 'reason', error)}."


def email_message(delivery: NotificationDelivery, to: str, sender: str) -> EmailMessage:
    job, links = delivery.payload["job"], delivery.payload["links"]
    what = {"finished": "finished", "failed": "failed", "waiting": "is waiting"}.get(delivery.event, delivery.event)
    message = EmailMessage()
    message["Subject"] = f"Lanner: job {job['name']} (#{job['id']}) {what}"
    message["From"], message["To"] = sender, to
    lines = [f"Your job {job['name']} (#{job['id']}, {job['method']}) {what}: its status is {job['status']}."]
    if delivery.payload.get("reason") or job.get("error"):
        lines += ["", delivery.payload.get("reason") or job["error"]]
    lines += ["", f"The job: {links['job']}", f"Its files: {links['artifacts']}"]
    message.set_content("\n".join(lines) + "\n")
    return message


def send_email(delivery: NotificationDelivery, to: str, settings: Settings) -> tuple[int | None, str | None]:
    if not settings.smtp_host:
        return None, "No SMTP server is set up: an admin sets LANNER_SMTP_HOST."
    sender = settings.smtp_from or f"lanner@{socket.getfqdn()}"
    try:
        if settings.smtp_security == "tls":
            client = smtplib.SMTP_SSL(settings.smtp_host, settings.smtp_port, timeout=TIMEOUT_SECONDS,
                                      context=ssl.create_default_context())
        else:
            client = smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=TIMEOUT_SECONDS)
        with client:
            if settings.smtp_security == "starttls":
                client.starttls(context=ssl.create_default_context())
            if settings.smtp_username:
                client.login(settings.smtp_username, settings.smtp_password)
            client.send_message(email_message(delivery, to, sender))
        return None, None
    except (smtplib.SMTPException, OSError) as error:
        return None, f"The SMTP server {settings.smtp_host}:{settings.smtp_port} refused or did not answer: {error}."


def _claim(session: Session, delivery_id: int, now: datetime) -> bool:
    return session.execute(
        update(NotificationDelivery)
        .where(NotificationDelivery.id == delivery_id, NotificationDelivery.state == DeliveryState.pending,
               NotificationDelivery.next_try_at <= now)
        .values(next_try_at=now + timedelta(seconds=CLAIM_SECONDS))
        .execution_options(synchronize_session=False)).rowcount == 1


def attempt(session: Session, delivery: NotificationDelivery, settings: Settings, now: datetime) -> None:
    """Sends one delivery once and records the outcome: delivered, a retry after a backoff, or failed
    for good after MAX_ATTEMPTS."""
    if delivery.webhook_id is not None:
        code, error = post_webhook(session.get(Webhook, delivery.webhook_id), delivery, settings)
    else:
        code, error = send_email(delivery, session.get(User, delivery.user_id).email, settings)
    delivery.attempts += 1
    delivery.status_code, delivery.error = code, error
    if error is None:
        delivery.state, delivery.delivered_at, delivery.next_try_at = DeliveryState.delivered, now, None
    elif delivery.attempts >= MAX_ATTEMPTS:
        delivery.state, delivery.next_try_at = DeliveryState.failed, None
    else:
        delivery.next_try_at = now + retry_delay(delivery.attempts)
    session.commit()


def deliver_due(settings: Settings, now: datetime | None = None) -> int:
    """Sends the deliveries due at `now` (default: now), each once. Returns how many it tried."""
    now = now or datetime.now(timezone.utc)
    tried = 0
    with session_factory(settings.database_url)() as session:
        due = session.scalars(select(NotificationDelivery.id).where(
            NotificationDelivery.state == DeliveryState.pending, NotificationDelivery.next_try_at <= now)
            .order_by(NotificationDelivery.next_try_at).limit(BATCH)).all()
        for delivery_id in due:
            claimed = _claim(session, delivery_id, now)
            session.commit()
            if not claimed:
                continue  # another API process took it
            attempt(session, session.get(NotificationDelivery, delivery_id, populate_existing=True), settings, now)
            tried += 1
    return tried


class NotificationSender:
    """The API process's thread that sends due deliveries every LOOK_SECONDS."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="lanner-notifications")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=TIMEOUT_SECONDS + LOOK_SECONDS)

    def _run(self) -> None:
        while not self._stop.wait(LOOK_SECONDS):
            try:
                while deliver_due(self.settings) == BATCH and not self._stop.is_set():
                    pass
            except Exception:  # the database away for a moment: look again at the next turn
                log.warning("could not send notifications", exc_info=True)
