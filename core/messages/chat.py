"""GPU chat messages between the API's playground socket and the worker's chat process, through Redis.

Per session job: REQUESTS (a list) carries ChatRequest in (generate an answer, or close the session);
ANSWER (a list per request) carries ChatEvent out (status, token, done, error: the playground socket's
messages without its `model` and `id`); STOP asks one answer to end; READY is set once the model is loaded.
On the wire each message is its model's JSON; `type` names it."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter

CONTEXT_TOKENS = 4096   # prompt + answer, as on the CPU path
KEY_SECONDS = 3600      # Redis keys of a session outlive no session by more than this

Side = Literal["base", "tuned"]
FinishReason = Literal["stop", "length", "stopped"]


class GenerateAnswer(BaseModel):
    type: Literal["generate"] = "generate"
    request_id: str
    side: Side
    messages: list[dict[str, str]]
    temperature: float
    top_p: float
    max_tokens: int
    stop: list[str]


class CloseSession(BaseModel):
    type: Literal["close"] = "close"


class AnswerStatus(BaseModel):
    type: Literal["status"] = "status"
    state: Literal["queued", "loading", "waiting", "generating"]


class AnswerToken(BaseModel):
    type: Literal["token"] = "token"
    text: str


class AnswerDone(BaseModel):
    type: Literal["done"] = "done"
    finish_reason: FinishReason
    chunks: int
    seconds: float


class AnswerError(BaseModel):
    type: Literal["error"] = "error"
    code: str
    message: str


ChatRequest = Annotated[GenerateAnswer | CloseSession, Field(discriminator="type")]
ChatEvent = Annotated[AnswerStatus | AnswerToken | AnswerDone | AnswerError, Field(discriminator="type")]
FINAL_EVENTS = (AnswerDone, AnswerError)  # the last message of an answer
_requests: TypeAdapter[ChatRequest] = TypeAdapter(ChatRequest)
_events: TypeAdapter[ChatEvent] = TypeAdapter(ChatEvent)


def read_request(raw: str | bytes) -> GenerateAnswer | CloseSession:
    return _requests.validate_json(raw)


def read_event(raw: str | bytes) -> AnswerStatus | AnswerToken | AnswerDone | AnswerError:
    return _events.validate_json(raw)


def push(redis, key: str, message: BaseModel) -> None:
    """Appends a request or an event to its Redis list, which expires KEY_SECONDS after the last one."""
    redis.rpush(key, message.model_dump_json())
    redis.expire(key, KEY_SECONDS)


def requests_key(job_id: int) -> str:
    return f"lanner:chat:{job_id}:requests"


def answer_key(job_id: int, request_id: str) -> str:
    return f"lanner:chat:{job_id}:answer:{request_id}"


def stop_key(job_id: int, request_id: str) -> str:
    return f"lanner:chat:{job_id}:stop:{request_id}"


def ready_key(job_id: int) -> str:
    return f"lanner:chat:{job_id}:ready"
