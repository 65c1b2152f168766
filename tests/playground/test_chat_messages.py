"""The GPU chat's messages (lanner.core.messages.chat) read back as the type they were sent as, and the
wire keeps the shape the relay and the chat process spoke before they were typed."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from lanner.core.messages.chat import (AnswerDone, AnswerError, AnswerStatus, AnswerToken, CloseSession, GenerateAnswer,
                                       read_event, read_request)


def test_requests_and_events_read_back_as_their_types():
    question = GenerateAnswer(request_id="r1", side="tuned", messages=[{"role": "user", "content": "Hi"}],
                              temperature=0.0, top_p=1.0, max_tokens=8, stop=["\n"])
    assert json.loads(question.model_dump_json()) == {
        "type": "generate", "request_id": "r1", "side": "tuned", "messages": [{"role": "user", "content": "Hi"}],
        "temperature": 0.0, "top_p": 1.0, "max_tokens": 8, "stop": ["\n"]}
    assert read_request(question.model_dump_json()) == question
    assert read_request('{"type": "close"}') == CloseSession()
    for event in (AnswerStatus(state="generating"), AnswerToken(text="Hel"),
                  AnswerError(code="context_full", message="long"),
                  AnswerDone(finish_reason="stop", chunks=3, seconds=0.25)):
        assert read_event(event.model_dump_json()) == event
    assert read_event('{"type": "done", "finish_reason": "length", "chunks": 2, "seconds": 1.5}') == \
        AnswerDone(finish_reason="length", chunks=2, seconds=1.5)


def test_an_unknown_or_incomplete_message_is_refused():
    with pytest.raises(ValidationError):
        read_request('{"type": "shutdown"}')
    with pytest.raises(ValidationError):
        read_request('{"type": "generate", "request_id": "r1"}')
    with pytest.raises(ValidationError):
        read_event('{"type": "token"}')
