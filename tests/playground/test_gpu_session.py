"""GPU chat as a queued job, end to end on the CPU test box: a session job is queued through the API,
waits in the queue (and the socket says where), a real Celery worker claims it and runs
lanner.worker.chat_process, which loads the fine-tuned SmolLM2 with transformers and streams answers
over /ws/playground; closing the session ends the job and the worker takes the next one."""
from __future__ import annotations

import json
import time

import httpx
import pytest
from websockets.sync.client import connect

from lanner.core.models import Job, JobKind, JobStatus
from playground_helpers import LONG_QUESTION, answer, celery_worker, receive_until_done

pytestmark = pytest.mark.timeout(600)


def ask(ws, job_id: int, session_id: int, sides=("tuned",), **options) -> None:
    chats = {side: [{"role": "user", "content": "What is 3 plus 3?"}] for side in sides}
    ws.send(json.dumps({"type": "generate", "id": "g1", "job_id": job_id, "chats": chats, "gpu_session": session_id,
                        "temperature": 0, "max_tokens": 16, **options}))


def job_row(studio, job_id: int) -> Job:
    with studio.sessions() as session:
        return session.get(Job, job_id)


def wait_for(studio, job_id: int, condition, timeout: float = 120) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = job_row(studio, job_id)
        if condition(job):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} stayed {job_row(studio, job_id).status}")


def test_a_gpu_session_is_a_queued_job_that_streams_answers_until_closed(served):
    studio = served.studio
    start = f"{served.url}/api/playground/jobs/{studio.trained_job}/gpu-session"
    created = httpx.post(start, headers=served.headers, json={})
    assert created.status_code == 201, created.text
    session = created.json()
    assert session["kind"] == "chat" and session["status"] == "queued" and session["queue_position"] == 1
    assert session["parent_job_id"] == studio.trained_job and session["memory_estimate_bytes"] > 2 * 134_000_000
    assert httpx.post(start, headers=served.headers, json={}).json()["id"] == session["id"]  # the open one again
    # A second session (another job's model) queues behind it.
    other = httpx.post(f"{served.url}/api/playground/jobs/{studio.no_eval_job}/gpu-session", headers=served.headers,
                       json={}).json()
    assert other["queue_position"] == 2

    worker = None
    try:
        with connect(served.ws_url) as ws:
            # No worker yet: the question waits, and the socket says the session is queued, and where.
            ask(ws, studio.trained_job, session["id"])
            queued = json.loads(ws.recv(timeout=30))
            assert queued["type"] == "status" and queued["state"] == "queued" and queued["queue_position"] == 1
            worker = celery_worker(studio)
            messages = [queued, *receive_until_done(ws, {"tuned"}, timeout=300)]
            states = [m["state"] for m in messages if m["type"] == "status"]
            assert states[-2:] == ["loading", "generating"], messages
            tokens = [m for m in messages if m["type"] == "token"]
            assert len(tokens) >= 3 and answer(messages, "tuned").strip(), messages
            assert messages[-1]["type"] == "done" and messages[-1]["chunks"] == len(tokens)
            assert messages[-1]["finish_reason"] in ("stop", "length")
            running = job_row(studio, session["id"])
            assert running.status == JobStatus.running and running.worker == worker.hostname

            # Side by side on the session: the base answer is the same model with its adapter off.
            ask(ws, studio.trained_job, session["id"], sides=("base", "tuned"), max_tokens=6)
            both = receive_until_done(ws, {"base", "tuned"}, timeout=120)
            assert {m["model"] for m in both if m["type"] == "done"} == {"base", "tuned"}
            assert answer(both, "base").strip() and answer(both, "tuned").strip()

            # A long answer stopped after its first token.
            ask(ws, studio.trained_job, session["id"], max_tokens=400,
                chats={"base": [{"role": "user", "content": LONG_QUESTION}]})
            first = {}
            while first.get("type") not in ("token", "done", "error"):
                first = json.loads(ws.recv(timeout=120))
            assert first["type"] == "token", first
            ws.send(json.dumps({"type": "stop"}))
            rest = receive_until_done(ws, {"base"}, timeout=120)
            assert rest[-1]["type"] == "done" and rest[-1]["finish_reason"] == "stopped"

        assert job_row(studio, other["id"]).status == JobStatus.queued  # the device is held by the session
        closed = httpx.post(f"{served.url}/api/playground/gpu-sessions/{session['id']}/close", headers=served.headers)
        assert closed.status_code == 200, closed.text
        ended = wait_for(studio, session["id"], lambda job: job.status != JobStatus.running)
        assert ended.status == JobStatus.succeeded and ended.error is None
        # The worker takes the next job: the second session.
        nxt = wait_for(studio, other["id"], lambda job: job.status != JobStatus.queued)
        assert nxt.status == JobStatus.running and nxt.kind == JobKind.chat and nxt.worker == worker.hostname

        with connect(served.ws_url) as ws:
            ask(ws, studio.trained_job, session["id"])
            (error,) = receive_until_done(ws, {"tuned"})
            assert error["code"] == "gpu_session_ended" and "has ended (succeeded)" in error["message"]
            ask(ws, studio.trained_job, other["id"])  # a session with another job's model
            (error,) = receive_until_done(ws, {"tuned"})
            assert error["code"] == "no_gpu_session" and error["model"] is None
        assert httpx.post(f"{served.url}/api/playground/gpu-sessions/{session['id']}/close",
                          headers=served.headers).status_code == 409
        httpx.post(f"{served.url}/api/playground/gpu-sessions/{other['id']}/close", headers=served.headers)
        assert wait_for(studio, other["id"], lambda job: job.status != JobStatus.running).status == JobStatus.succeeded
    finally:
        if worker is not None:
            worker.stop()


def test_a_gpu_session_needs_a_finished_job_and_a_queued_one_is_cancelled_on_close(served):
    studio = served.studio
    running = studio.add_job(status=JobStatus.running)
    refused = httpx.post(f"{served.url}/api/playground/jobs/{running}/gpu-session", headers=served.headers)
    assert refused.status_code == 409 and "once it has succeeded" in refused.json()["detail"]
    no_weights = studio.add_job(status=JobStatus.succeeded)
    refused = httpx.post(f"{served.url}/api/playground/jobs/{no_weights}/gpu-session", headers=served.headers)
    assert refused.status_code == 409 and "saved no adapter or model" in refused.json()["detail"]
    assert httpx.post(f"{served.url}/api/playground/jobs/{studio.export_job}/gpu-session",
                      headers=served.headers).status_code == 409

    queued = httpx.post(f"{served.url}/api/playground/jobs/{studio.trained_job}/gpu-session", headers=served.headers,
                        json={"idle_seconds": 60}).json()
    assert queued["config"] == {"chat": {"idle_seconds": 60}}
    closed = httpx.post(f"{served.url}/api/playground/gpu-sessions/{queued['id']}/close", headers=served.headers)
    assert closed.status_code == 200 and closed.json()["status"] == "cancelled"
    assert httpx.post(f"{served.url}/api/playground/gpu-sessions/{studio.trained_job}/close",
                      headers=served.headers).status_code == 404
    for job_id in (running, no_weights):
        studio.set_status(job_id, JobStatus.failed)  # nothing runs them: keep them out of the workers' way


def test_the_chat_kind_needs_no_migration_on_sqlite_or_postgresql(database_url):
    # job_kind is a plain string column (no native enum, no CHECK): a new kind is stored as it is
    from lanner.core import db
    from lanner.core.models import User

    db.migrate(database_url)
    with db.session_factory(database_url)() as session:
        user = User(email="chat@example.com", display_name="C", role="member", password_hash="x")
        session.add(user)
        session.flush()
        job = Job(owner_id=user.id, kind=JobKind.chat, name="GPU chat", method="chat", model="m", config={}, gpus=1)
        session.add(job)
        session.commit()
        job_id = job.id
    with db.session_factory(database_url)() as session:
        assert session.get(Job, job_id).kind == JobKind.chat
