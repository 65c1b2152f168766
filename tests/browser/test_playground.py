"""The Playground page in Debian's Chromium against the real stack: a finished job without a GGUF
offers its export; its base model (the shipped SmolLM2 GGUF) answers a question, streamed token by
token over the WebSocket into the page."""
from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from browser_helpers import expect_heading, shot, sign_in_context
from job_specs import stored_spec

pytestmark = pytest.mark.timeout(300)


def finished_job(stack) -> int:
    """A succeeded LoRA job of the admin, written as the worker leaves one (training is not the point here)."""
    from datetime import datetime, timezone

    from lanner.core.db import session_factory
    from lanner.core.models import Job, JobStatus, User

    with session_factory(f"sqlite:///{stack.data_dir / 'lanner.db'}")() as session:
        admin = session.query(User).filter_by(role="admin").first()
        job = Job(owner_id=admin.id, name="playground flow", method="lora", model="builtin/SmolLM2-135M-Instruct",
                  config=stored_spec(), gpus=0, status=JobStatus.succeeded, finished_at=datetime.now(timezone.utc))
        session.add(job)
        session.commit()
        return job.id


def test_the_playground_streams_an_answer_from_the_base_model(stack, chromium):
    with sign_in_context(chromium, stack.url) as context:
        job_id = finished_job(stack)
        page = context.new_page()
        frames: list[dict] = []
        page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(json.loads(payload)))
                if ws.url.endswith("/ws/playground") else None)

        page.goto(f"{stack.url}/playground?job={job_id}")
        expect_heading(page, "Playground")
        expect(page.get_by_test_id("tuned-gguf")).to_contain_text("export a GGUF first")
        expect(page.get_by_role("button", name="Export a GGUF (q8_0)")).to_be_visible()
        expect(page.get_by_test_id("base-gguf")).to_contain_text("SmolLM2-135M-Instruct.Q4_1.gguf")

        page.get_by_label("Base model", exact=True).check()
        page.get_by_label("Max tokens").fill("32")
        page.get_by_label("Temperature").fill("0")
        page.get_by_label("Your message").fill("What is the capital of France?")
        page.get_by_role("button", name="Send").click()
        expect(page.get_by_test_id("finish-base")).to_be_visible(timeout=120_000)
        answer = page.get_by_test_id("answer-base").inner_text()
        shot(page, "playground")

    tokens = [frame for frame in frames if frame["type"] == "token"]
    assert len(tokens) >= 3 and answer.strip() == "".join(frame["text"] for frame in tokens).strip()
    assert frames[-1]["type"] == "done" and frames[-1]["model"] == "base"
