"""One side's answer from a GPU session (gpu_session.py): wait while the session is queued or loading its
model, push the question to the session's process through Redis, and forward the events it answers
with until `done` or `error` (lanner.core.messages.chat)."""
from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING

from redis import Redis

from lanner.backend.playground.gpu_session import session_state
from lanner.core import db
from lanner.core.messages.chat import (FINAL_EVENTS, KEY_SECONDS, AnswerError, AnswerStatus,
                                      GenerateAnswer, Side, answer_key, push, read_event, ready_key, requests_key,
                                      stop_key)
from lanner.core.models import JobStatus
from lanner.core.redis_client import get_redis
from lanner.core.settings import Settings

if TYPE_CHECKING:
    from lanner.backend.playground.answers import Answers

log = logging.getLogger(__name__)
POLL_SECONDS = 1


def relay(answers: Answers, settings: Settings, side: Side) -> None:
    started, job_id, request = time.monotonic(), answers.request.gpu_session, answers.request
    try:
        redis = get_redis(settings.redis_url)
        if not _wait_for_session(answers, settings, redis, side, started):
            return
        request_id = uuid.uuid4().hex
        push(redis, requests_key(job_id), GenerateAnswer(
            request_id=request_id, side=side, messages=request.conversation(side), temperature=request.temperature,
            top_p=request.top_p, max_tokens=request.max_tokens, stop=request.stop))
        stop_sent = False
        while True:
            item = redis.blpop([answer_key(job_id, request_id)], timeout=POLL_SECONDS)
            if answers.stop.is_set() and not stop_sent:
                redis.set(stop_key(job_id, request_id), "1", ex=KEY_SECONDS)
                stop_sent = True
            if item is None:
                status, _, error = _state(settings, redis, job_id)
                if status != JobStatus.running:
                    answers.emit(side, AnswerError(code="gpu_session_ended", message=(
                        f"Generation stopped: the GPU session (job {job_id}) ended "
                        f"({status.value}){': ' + error if error else ''}.")))
                    return
                continue
            event = read_event(item[1])
            answers.emit(side, event)
            if isinstance(event, FINAL_EVENTS):
                redis.delete(answer_key(job_id, request_id), stop_key(job_id, request_id))
                return
    except Exception as error:
        log.exception("Playground GPU relay failed")
        answers.emit(side, AnswerError(code="failed", message=f"The GPU session could not answer: "
                                                              f"{type(error).__name__}: {error}"))


def _state(settings: Settings, redis: Redis, job_id: int) -> tuple[JobStatus, int | None, str | None]:
    with db.session_factory(settings.database_url)() as session:
        return session_state(session, redis, job_id)


def _wait_for_session(answers: Answers, settings: Settings, redis: Redis, side: Side, started: float) -> bool:
    """Until the session's process has loaded the model: status `queued` (with the queue position,
    each time it changes), then `loading`. False (and the reason sent) when it ended or was stopped."""
    job_id, shown = answers.request.gpu_session, None
    while True:
        status, position, error = _state(settings, redis, job_id)
        if status == JobStatus.running and redis.exists(ready_key(job_id)):
            return True
        if status not in (JobStatus.queued, JobStatus.running):
            answers.emit(side, AnswerError(code="gpu_session_ended", message=(
                f"The GPU session (job {job_id}) has ended ({status.value}){': ' + error if error else ''}. "
                "Start a new one to chat on a GPU.")))
            return False
        state = ("queued", position) if status == JobStatus.queued else ("loading", None)
        if state != shown:
            shown = state
            answers.emit(side, AnswerStatus(state=state[0]), gpu_session=job_id,
                         **({"queue_position": position} if status == JobStatus.queued else {}))
        if answers.stop.wait(POLL_SECONDS):
            answers.done(side, "stopped", 0, started)
            return False
