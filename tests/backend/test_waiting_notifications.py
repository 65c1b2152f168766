"""A job queued where no worker is free to start it notifies its owner once, with the reason in words
(core/queue/waiting.py): the webhook's body and the e-mail carry it, the queue's `added` event too (the
browser's notice); a sweep's runs send one notice for all."""
from __future__ import annotations

import pytest

from lanner.core import db
from lanner.core.messages.device import Device
from lanner.core.models import JobStatus, NotificationDelivery
from lanner.core.queue.claim import note_waiting_jobs
from lanner.core.queue.waiting import WAITING_PREFIX, queue_reason
from lanner.core.streams import QUEUE_STREAM, read_after
from lanner.core.worker_registry import announce_worker, reserve_devices

from backend_helpers import CHAT_ROWS, MODEL, set_status, submit, upload

GIB = 2**30


@pytest.fixture(autouse=True)
def private_targets(monkeypatch):
    monkeypatch.setenv("LANNER_WEBHOOK_PRIVATE_TARGETS", "true")


def test_the_reason_in_words():
    assert queue_reason(0, 0, 0) == f"{WAITING_PREFIX}no worker is running; it starts when one does."
    assert queue_reason(2, 0, 0).endswith("when one does, after 2 jobs ahead of it.")
    assert queue_reason(0, 1, 1) == f"{WAITING_PREFIX}the one worker is busy; it runs in its turn."
    assert queue_reason(1, 3, 3) == f"{WAITING_PREFIX}all 3 workers are busy and 1 job is ahead of it; it runs in its turn."
    assert queue_reason(2, 3, 1) == f"{WAITING_PREFIX}2 jobs ahead of it for 2 free workers; it runs in its turn."
    assert queue_reason(0, 1, 0) is None and queue_reason(1, 3, 1) is None  # a free worker is left for it


def waiting_deliveries(api) -> list[tuple[int, str]]:
    with db.session_factory(api.settings.database_url)() as session:
        return [(row.job_id, row.payload["reason"]) for row in session.query(NotificationDelivery)
                .filter(NotificationDelivery.event == "waiting").order_by(NotificationDelivery.id)]


def added_events(api) -> dict[int, str | None]:
    return {data["job_id"]: data["waiting"] for _, kind, data in read_after(api.redis, QUEUE_STREAM) if kind == "added"}


def test_a_job_that_waits_notifies_once_with_why_and_a_sweep_once(team, wakes):
    hook = team.alice.post("/api/webhooks", json={"url": "http://127.0.0.1:9/hook", "events": ["waiting"]})
    assert hook.status_code == 201, hook.text
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]

    first = submit(team.alice, dataset, gpus=0).json()["id"]  # no worker is live
    reason = f"{WAITING_PREFIX}no worker is running; it starts when one does."
    assert waiting_deliveries(team.api) == [(first, reason)]
    assert added_events(team.api) == {first: reason}

    # A free worker, and nothing ahead: it starts at once, no notice.
    set_status(team.api, first, JobStatus.succeeded)
    gpu = Device(kind="cuda", name="test gpu", memory_total_bytes=80 * GIB, id="GPU-a", host="box", machine="GPU-a")
    announce_worker(team.api.redis, "gpu0@box", gpu)
    second = submit(team.alice, dataset, gpus=1).json()["id"]
    assert added_events(team.api)[second] is None and len(waiting_deliveries(team.api)) == 1

    # The worker busy: the next job waits behind the queued one; bob has no webhook, nothing for him.
    assert reserve_devices(team.api.redis, ["GPU-a"], "gpu0@box")
    third = submit(team.alice, dataset, gpus=1).json()["id"]
    submit(team.bob, dataset, gpus=1)
    busy = f"{WAITING_PREFIX}the one worker is busy and 1 job is ahead of it; it runs in its turn."
    assert waiting_deliveries(team.api)[1:] == [(third, busy)]

    # A sweep of three runs: one notice, on its first run, saying how many wait.
    made = team.alice.post("/api/sweeps", json={
        "base": {"method": "lora", "model": MODEL, "dataset_id": dataset, "gpus": 1}, "metric": "loss",
        "parameters": [{"field": "hyperparameters.learning_rate", "values": [1e-4, 2e-4, 3e-4]}]})
    assert made.status_code == 201, made.text
    runs = made.json()["job_ids"]
    [(job_id, told)] = waiting_deliveries(team.api)[2:]
    assert job_id == runs[0] and told.startswith(f"{WAITING_PREFIX}the one worker is busy and 3 jobs are ahead")
    assert told.endswith(f"(3 runs of sweep #{made.json()['id']} wait; this is the one notice for them.)")
    events = added_events(team.api)
    assert events[runs[0]] == told and events[runs[1]] is None and events[runs[2]] is None

    # Once per job: the same job later waiting for GPUs (its machine lost) is no news.
    with db.session_factory(team.api.settings.database_url)() as session:
        set_status(team.api, third, JobStatus.queued, gpus=2)
        assert third in note_waiting_jobs(session, 1)
    assert len(waiting_deliveries(team.api)) == 3
