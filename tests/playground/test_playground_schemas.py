"""The playground's answers as the OpenAPI document describes them: times in UTC with their offset, socket
messages with only the fields that apply to them."""
from __future__ import annotations

from datetime import datetime

from lanner.backend.schemas.playground import ModelFileOut, PlaygroundJobOut, socket_message
from lanner.core.messages.chat import AnswerError, AnswerStatus


def test_a_finished_job_is_listed_with_its_time_in_utc_and_its_offset():
    side = ModelFileOut(available=False, code="not_exported", reason="export a GGUF first")
    listed = PlaygroundJobOut(job_id=1, name="job", model="builtin/SmolLM2-135M-Instruct", status="succeeded",
                              finished_at=datetime(2026, 12, 2, 8, 30), custom_chat_template=False, tuned=side,
                              base=side, export_url="/api/jobs/1/export", pending_export=None)
    finished = datetime.fromisoformat(listed.model_dump(mode="json")["finished_at"])
    assert finished.utcoffset().total_seconds() == 0 and finished.hour == 8


def test_socket_messages_carry_their_type_and_only_the_fields_that_apply():
    assert socket_message(AnswerStatus(state="loading"), model="base", id="q1") == {
        "type": "status", "state": "loading", "model": "base", "id": "q1"}
    queued = socket_message(AnswerStatus(state="queued"), model="tuned", id=3, queue_position=2, gpu_session=9)
    assert queued["queue_position"] == 2 and queued["gpu_session"] == 9
    refused = socket_message(AnswerError(code="bad_request", message="Send a generate request"), model=None,
                             id={"any": "json"})
    assert refused == {"type": "error", "code": "bad_request", "message": "Send a generate request", "model": None,
                       "id": {"any": "json"}}
