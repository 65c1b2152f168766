"""Notifications: webhooks POSTed to a real HTTP receiver (signature, retry after a 500, backoff to a
final failure), e-mail through a real SMTP server (aiosmtpd), the events written where a job ends or
waits, and the refusals in words."""
from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import datetime, timedelta, timezone

import pytest
from aiosmtpd.controller import Controller

from lanner.backend.notification_sender import deliver_due
from lanner.core import db
from lanner.core.models import Job, JobKind, JobStatus
from lanner.core.notifications import MAX_ATTEMPTS, retry_delay
from lanner.core.queue.claim import note_waiting_jobs, sweep_orphaned_jobs
from lanner.worker.events import finish_job

from backend_helpers import MODEL, field_errors
from support import WebhookReceiver, free_port


@pytest.fixture
def receiver():
    server = WebhookReceiver([500])
    yield server
    server.shutdown()


@pytest.fixture(autouse=True)
def private_targets(monkeypatch):
    monkeypatch.setenv("LANNER_WEBHOOK_PRIVATE_TARGETS", "true")  # the receivers listen on localhost


def add_job(api, owner_id: int, status=JobStatus.running, **fields) -> int:
    with db.session_factory(api.settings.database_url)() as session:
        job = Job(owner_id=owner_id, name="tiny-lora", method=fields.pop("method", "lora"), model=MODEL, config={}, status=status,
                  worker="worker-a", **fields)
        session.add(job)
        session.commit()
        return job.id


def test_a_finished_job_is_posted_signed_and_retried_after_a_500(team_on_each_database, receiver):
    team = team_on_each_database
    created = team.alice.post("/api/webhooks", json={"url": receiver.url, "events": ["finished", "failed"]})
    assert created.status_code == 201, created.text
    hook = created.json()
    assert len(hook["secret"]) == 64 and "secret" not in team.alice.get("/api/webhooks").json()[0]
    job_id = add_job(team.api, team.ids["alice"])
    sessions = db.session_factory(team.api.settings.database_url)

    assert finish_job(sessions, job_id, "worker-a", JobStatus.succeeded, None)
    assert deliver_due(team.api.settings) == 1
    first = team.alice.get(f"/api/webhooks/{hook['id']}/deliveries").json()
    assert [(d["event"], d["state"], d["attempts"], d["status_code"]) for d in first] == [("finished", "pending", 1, 500)]
    assert "500" in first[0]["error"]
    assert deliver_due(team.api.settings) == 0  # not before its backoff
    assert deliver_due(team.api.settings, now=datetime.now(timezone.utc) + retry_delay(1)) == 1

    [delivered] = team.alice.get(f"/api/webhooks/{hook['id']}/deliveries").json()
    assert (delivered["state"], delivered["attempts"], delivered["status_code"], delivered["error"]) == \
        ("delivered", 2, 200, None)
    assert len(receiver.requests) == 2 and receiver.requests[0][1] == receiver.requests[1][1]
    headers, body = receiver.requests[1]
    expected = hmac.new(hook["secret"].encode(), body, hashlib.sha256).hexdigest()
    assert headers["X-Lanner-Signature"] == f"sha256={expected}"
    assert abs(int(headers["X-Lanner-Timestamp"]) - datetime.now(timezone.utc).timestamp()) < 60
    payload = json.loads(body)
    assert payload["event"] == "finished"
    assert payload["job"] | {"id": job_id} == {"id": job_id, "name": "tiny-lora", "kind": "train", "method": "lora",
                                               "status": "succeeded", "error": None}
    assert payload["links"]["job"].endswith(f"/jobs/{job_id}")
    assert team.bob.get(f"/api/webhooks/{hook['id']}/deliveries").status_code == 404  # alice's log is hers


def test_a_failed_or_waiting_job_notifies_the_webhooks_that_asked_and_a_test_needs_no_job(team, receiver):
    failed_only = team.alice.post("/api/webhooks", json={"url": receiver.url, "events": ["failed"]}).json()
    waiting_only = team.alice.post("/api/webhooks", json={"url": receiver.url, "events": ["waiting"]}).json()
    lost = add_job(team.api, team.ids["alice"], kind=JobKind.export)  # not requeued: failed
    waiting = add_job(team.api, team.ids["alice"], status=JobStatus.queued, gpus=4)
    add_job(team.api, team.ids["bob"], status=JobStatus.queued, gpus=4)  # bob has no webhook
    with db.session_factory(team.api.settings.database_url)() as session:
        sweep_orphaned_jobs(session, set(), reason="The worker is gone.")
        assert note_waiting_jobs(session, 2)
        assert note_waiting_jobs(session, 1)  # another reason, the same wait: no second notification
    assert team.alice.post(f"/api/webhooks/{failed_only['id']}/test").status_code == 202
    deliver_due(team.api.settings)

    log = {hook["id"]: team.alice.get(f"/api/webhooks/{hook['id']}/deliveries").json()
           for hook in (failed_only, waiting_only)}
    assert [(d["event"], d["job_id"]) for d in log[failed_only["id"]]] == [("test", None), ("failed", lost)]
    assert [(d["event"], d["job_id"]) for d in log[waiting_only["id"]]] == [("waiting", waiting)]
    events = sorted(json.loads(body)["event"] for _, body in receiver.requests)
    assert events == ["failed", "test", "waiting"]  # the first answer was the 500: one of them is pending
    assert sum(d["state"] == "pending" for deliveries in log.values() for d in deliveries) == 1


def test_a_delivery_backs_off_and_fails_for_good_after_its_last_attempt(team):
    closed = f"http://127.0.0.1:{free_port()}/"  # nothing listens there
    hook = team.alice.post("/api/webhooks", json={"url": closed, "events": ["finished"]}).json()
    assert team.alice.post(f"/api/webhooks/{hook['id']}/test").status_code == 202
    now = datetime.now(timezone.utc)
    waits = []
    for attempt in range(1, MAX_ATTEMPTS + 1):
        assert deliver_due(team.api.settings, now=now) == 1
        [delivery] = team.alice.get(f"/api/webhooks/{hook['id']}/deliveries").json()
        assert delivery["attempts"] == attempt and "No answer from" in delivery["error"]
        if delivery["next_try_at"]:
            waits.append(datetime.fromisoformat(delivery["next_try_at"]) - now)
            now += retry_delay(attempt)
    assert delivery["state"] == "failed" and delivery["next_try_at"] is None
    assert [round(wait.total_seconds()) for wait in waits] == [15, 30, 60, 120, 240, 480, 960, 1920, 3600]
    assert deliver_due(team.api.settings, now=now + timedelta(days=1)) == 0


def test_webhooks_refuse_bad_targets_and_input_in_words(team, monkeypatch):
    def refused(url: str, events=("finished",)) -> dict:
        return field_errors(team.alice.post("/api/webhooks", json={"url": url, "events": list(events)}))

    assert "http:// or https://" in refused("file:///etc/passwd")[("url",)]
    assert "http:// or https://" in refused("gopher://example.com/")[("url",)]
    assert "does not resolve" in refused("http://no-such-host.invalid/")[("url",)]
    assert "not a valid URL" in refused("http://[nonsense/")[("url",)]
    assert "not a valid URL" in refused("http://example.com:port/")[("url",)]
    assert ("events",) in refused("http://127.0.0.1:1/", events=())
    assert "twice" in refused("http://127.0.0.1:1/", events=("failed", "failed"))[("events",)]
    assert ("events", 0) in refused("http://127.0.0.1:1/", events=("exploded",))
    monkeypatch.setenv("LANNER_WEBHOOK_PRIVATE_TARGETS", "false")
    team.api.settings.webhook_private_targets = False  # what an admin's default gives
    for private in ("http://127.0.0.1:8000/", "http://169.254.169.254/latest/meta-data", "http://[::1]/",
                    "http://10.1.2.3/"):
        assert "LANNER_WEBHOOK_PRIVATE_TARGETS" in refused(private)[("url",)], private
    assert team.alice.delete("/api/webhooks/999").json()["detail"] == "No webhook 999 of yours"


def test_a_webhook_is_changed_and_deleted_by_its_owner_only(team, receiver):
    hook = team.alice.post("/api/webhooks", json={"url": receiver.url, "events": ["finished"]}).json()
    changed = {"url": receiver.url + "?v=2", "events": ["failed", "waiting"]}
    assert team.bob.put(f"/api/webhooks/{hook['id']}", json=changed).status_code == 404
    assert team.bob.delete(f"/api/webhooks/{hook['id']}").status_code == 404
    assert team.alice.put(f"/api/webhooks/{hook['id']}", json=changed).json() | {"created_at": None} == \
        {"id": hook["id"], **changed, "created_at": None}
    assert team.alice.delete(f"/api/webhooks/{hook['id']}").status_code == 204
    assert team.alice.get("/api/webhooks").json() == []


class Inbox:
    def __init__(self):
        self.messages = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(envelope)
        return "250 OK"


def test_an_opted_in_user_is_emailed_through_the_admins_smtp_server(team_with):
    inbox, port = Inbox(), free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        team = team_with(LANNER_SMTP_HOST="127.0.0.1", LANNER_SMTP_PORT=str(port), LANNER_SMTP_SECURITY="none",
                         LANNER_SMTP_FROM="studio@lanner.test")
        assert team.alice.get("/api/me/notifications").json() == \
            {"enabled": False, "available": True, "address": "alice@example.com"}
        assert team.alice.put("/api/me/notifications", json={"enabled": True}).json()["enabled"] is True
        job_id = add_job(team.api, team.ids["alice"], kind=JobKind.export)
        add_job(team.api, team.ids["bob"], kind=JobKind.export)  # bob did not opt in
        with db.session_factory(team.api.settings.database_url)() as session:
            sweep_orphaned_jobs(session, set(), reason="The worker is gone.")
        assert deliver_due(team.api.settings) == 1
    finally:
        controller.stop()
    [message] = inbox.messages
    assert message.mail_from == "studio@lanner.test" and message.rcpt_tos == ["alice@example.com"]
    text = message.content.decode()
    assert f"Subject: Lanner: job tiny-lora (#{job_id}) failed" in text
    assert "The worker is gone." in text and f"/jobs/{job_id}" in text


def test_email_cannot_be_chosen_before_an_admin_sets_up_smtp(team):
    assert team.alice.get("/api/me/notifications").json()["available"] is False
    errors = field_errors(team.alice.put("/api/me/notifications", json={"enabled": True}))
    assert "LANNER_SMTP_HOST" in errors[("enabled",)]
    assert team.alice.put("/api/me/notifications", json={"enabled": False}).json()["enabled"] is False


def test_the_served_api_sends_due_deliveries_by_itself(team, receiver):
    receiver.answers.clear()
    hook = team.alice.post("/api/webhooks", json={"url": receiver.url, "events": ["finished"]}).json()
    with team.api.client():  # runs the app's lifespan, and with it the sender's thread
        assert team.alice.post(f"/api/webhooks/{hook['id']}/test").status_code == 202
        deadline = time.monotonic() + 10
        while not receiver.requests and time.monotonic() < deadline:
            time.sleep(0.2)
    assert json.loads(receiver.requests[0][1])["event"] == "test"
    assert team.alice.get(f"/api/webhooks/{hook['id']}/deliveries").json()[0]["state"] == "delivered"
