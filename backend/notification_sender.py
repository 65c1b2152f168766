"""Sends the notifications (lanner.core.notifications): webhooks' signed POSTs and e-mail, with retries.

The deliveries are database rows, written with the job's status; a thread of the API process sends
the due ones every few seconds. The API, not a worker, sends them: a worker's only Celery slot is
taken by a job for hours, and a job may end (cancel of a queued job, a swept worker) with no worker
alive; the rows outlive a restart of either, and the sender takes up the pending ones when the API
is back. A row is claimed by moving its next try ahead before it is sent, so several API processes
never send one twice at once. SENDERS threads send at once, so that a slow receiver holds one of them.
"""
from __future__ import annotations

import hashlib
import hmac
import http.client
import ipaddress
import json
import logging
import smtplib
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from email.message import EmailMessage
from urllib.parse import urlsplit

from sqlalchemy import and_, delete, select, update
from sqlalchemy.orm import Session, sessionmaker

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
SENDERS = 8  # deliveries sent at once
KEPT_DELIVERIES = 100  # finished deliveries kept per webhook (per user's e-mail), newest first

log = logging.getLogger(__name__)


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def resolve_target(url: str, allow_private: bool) -> tuple[str | None, str | None]:
    """(why a webhook may not POST to this URL, in words, or None; the address to connect to). Not
    http(s), no host, a host that does not resolve, or (unless an admin allows them) one with any
    address that is private, loopback, link-local or otherwise not public. The host is resolved here
    once, and the POST goes to the address this returns: a name whose DNS answers a public address to
    the check and a private one to a second look-up (DNS rebinding) never gets that second look-up."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:  # a bracketed host that is no IPv6 address, a port that is no number...
        return f"is not a valid URL ({error})", None
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL", None
    if not parts.hostname:
        return "has no host", None
    try:
        infos = socket.getaddrinfo(parts.hostname, port or (443 if parts.scheme == "https" else 80),
                                   proto=socket.IPPROTO_TCP)
    except (ValueError, OSError) as error:
        return f"cannot be reached: {parts.hostname} does not resolve ({error})", None
    addresses = [info[4][0] for info in infos]
    if not allow_private:
        for address in addresses:
            checked = ipaddress.ip_address(address.split("%")[0])
            if not checked.is_global:
                return (f"points at {checked}, a private address; an admin allows those with "
                        f"LANNER_WEBHOOK_PRIVATE_TARGETS=true"), None
    return None, addresses[0]


def target_problem(url: str, allow_private: bool) -> str | None:
    """Why a webhook may not POST to this URL (resolve_target), or None."""
    return resolve_target(url, allow_private)[0]


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to `address` for the URL's host name, which stays in the Host header."""

    def __init__(self, host: str, port: int | None, address: str, **kwargs):
        super().__init__(host, port, **kwargs)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection to `address` whose TLS names the URL's host (SNI) and checks its certificate
    against that name."""

    def __init__(self, host: str, port: int | None, address: str, **kwargs):
        super().__init__(host, port, context=ssl.create_default_context(), **kwargs)
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def post_webhook(hook: Webhook, delivery: NotificationDelivery, settings: Settings) -> tuple[int | None, str | None]:
    """One attempt: (HTTP status, None) on a 2xx answer, else (status or None, why in words). A
    redirect is not followed (it could lead where the URL check refused)."""
    problem, address = resolve_target(hook.url, settings.webhook_private_targets)
    if problem:
        return None, f"The URL {problem}."
    parts = urlsplit(hook.url)
    body = json.dumps(delivery.payload, separators=(",", ":")).encode()
    kind = _PinnedHTTPSConnection if parts.scheme == "https" else _PinnedHTTPConnection
    connection = kind(parts.hostname, parts.port, address, timeout=TIMEOUT_SECONDS)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        connection.request("POST", target, body=body, headers={
            "Content-Type": "application/json", "User-Agent": "Lanner-Webhook",
            SIGNATURE_HEADER: sign(hook.secret, body), TIMESTAMP_HEADER: str(int(time.time())),
            EVENT_HEADER: delivery.event})
        response = connection.getresponse()
        code, reason = response.status, response.reason
    except (OSError, http.client.HTTPException) as error:
        return None, f"No answer from {parts.netloc}: {error}."
    finally:
        connection.close()
    if 200 <= code < 300:
        return code, None
    reason = "a redirect, which is not followed" if 300 <= code < 400 else reason
    return code, f"The receiver answered {code} ({reason})."


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


def prune(session: Session, delivery: NotificationDelivery) -> None:
    """Keeps the newest KEPT_DELIVERIES finished deliveries of the delivery's webhook (of its user's
    e-mail when it has none); pending ones are never pruned."""
    same = (NotificationDelivery.webhook_id == delivery.webhook_id if delivery.webhook_id is not None else
            and_(NotificationDelivery.webhook_id.is_(None), NotificationDelivery.user_id == delivery.user_id))
    finished = and_(same, NotificationDelivery.state != DeliveryState.pending)
    kept = select(NotificationDelivery.id).where(finished).order_by(NotificationDelivery.id.desc()).limit(KEPT_DELIVERIES)
    session.execute(delete(NotificationDelivery).where(finished, NotificationDelivery.id.not_in(kept.scalar_subquery()))
                    .execution_options(synchronize_session=False))


def attempt(session: Session, delivery: NotificationDelivery, settings: Settings, now: datetime) -> None:
    """Sends one delivery once and records the outcome: delivered, a retry after a backoff, or failed
    for good after MAX_ATTEMPTS (then the webhook's log is pruned)."""
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
    if delivery.state != DeliveryState.pending:
        session.flush()
        prune(session, delivery)
    session.commit()


def _send_one(sessions: sessionmaker[Session], delivery_id: int, settings: Settings, now: datetime) -> bool:
    """Claims and sends one due delivery in a session of its own (a sender thread's). Whether it did."""
    with sessions() as session:
        claimed = _claim(session, delivery_id, now)
        session.commit()
        if not claimed:
            return False  # another API process (or a turn before) took it
        attempt(session, session.get(NotificationDelivery, delivery_id, populate_existing=True), settings, now)
        return True


_senders = ThreadPoolExecutor(max_workers=SENDERS, thread_name_prefix="lanner-webhook")


def deliver_due(settings: Settings, now: datetime | None = None) -> int:
    """Sends the deliveries due at `now` (default: now), each once, SENDERS at a time: a receiver that
    takes its 10 s holds one sender, not the others. Returns how many it tried."""
    now = now or datetime.now(timezone.utc)
    sessions = session_factory(settings.database_url)
    with sessions() as session:
        due = session.scalars(select(NotificationDelivery.id).where(
            NotificationDelivery.state == DeliveryState.pending, NotificationDelivery.next_try_at <= now)
            .order_by(NotificationDelivery.next_try_at).limit(BATCH)).all()
    sent = [_senders.submit(_send_one, sessions, delivery_id, settings, now) for delivery_id in due]
    return sum(future.result() for future in sent)


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
