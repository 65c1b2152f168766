"""What the playground takes and answers: the socket's requests and messages, the GPU session's options, the
jobs it chats with and a job's before/after evaluation."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lanner.backend.schemas.common import MAX_ID, UtcDateTime
from lanner.core.messages.chat import AnswerDone, AnswerError, AnswerStatus, AnswerToken, Side
from lanner.core.models import JobStatus
from lanner.inference.generation import Sampling


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: str = Field(max_length=100_000)


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["generate"]
    id: str | int | None = None
    job_id: int = Field(ge=1, le=MAX_ID)
    chats: dict[Side, list[Message]] = Field(min_length=1, description="tuned, base or both (side by side)")
    system: str | None = Field(default=None, max_length=20_000)
    temperature: float = Field(default=Sampling.temperature, ge=0, le=2)
    top_p: float = Field(default=Sampling.top_p, gt=0, le=1)
    max_tokens: int = Field(default=Sampling.max_tokens, ge=1, le=4096)
    stop: list[str] = Field(default_factory=list, max_length=8)
    gpu_session: int | None = Field(default=None, ge=1, le=MAX_ID,
                                    description="Answer on this GPU session (a chat job) instead of the CPU")

    @field_validator("chats")
    @classmethod
    def _ends_with_a_question(cls, chats: dict[str, list[Message]]) -> dict[str, list[Message]]:
        for side, messages in chats.items():
            if not messages or messages[-1].role != "user":
                raise ValueError(f"the {side} conversation must end with the user's message")
        return chats

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: list[str]) -> list[str]:
        if any(not 1 <= len(text) <= 64 for text in stop):
            raise ValueError("each stop string has 1 to 64 characters")
        return stop

    def conversation(self, side: Side) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system}] if self.system and self.system.strip() else []
        return system + [message.model_dump() for message in self.chats[side]]

    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.max_tokens, list(self.stop))


class GpuSessionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    idle_seconds: int | None = Field(default=None, ge=10, le=86_400, description="Ends after this long without "
                                     "a question (default LANNER_PLAYGROUND_GPU_IDLE_SECONDS)")


class StopAnswers(BaseModel):
    """Asks the playground socket to stop the answers that are coming."""
    type: Literal["stop"]


# What the playground socket sends: the chat events of lanner.core.messages.chat with the side (`model`)
# and the request's `id`; `type` is required so that each message names itself on the wire.
class SocketStatus(AnswerStatus):
    type: Literal["status"]
    id: Any  # the request's id, echoed as the client sent it
    model: Side
    queue_position: int | None = Field(default=None, description="With queued: the GPU session's place (1 runs next)")
    gpu_session: int | None = Field(default=None, description="The GPU session (a chat job) that will answer")


class SocketToken(AnswerToken):
    type: Literal["token"]
    id: Any  # the request's id, echoed as the client sent it
    model: Side


class SocketDone(AnswerDone):
    type: Literal["done"]
    id: Any  # the request's id, echoed as the client sent it
    model: Side


class SocketError(AnswerError):
    type: Literal["error"]
    id: Any  # the request's id, echoed as the client sent it
    model: Side | None = Field(description="None: the request as a whole was refused")
    export_url: str | None = Field(default=None, description="With not_exported: where to ask for the GGUF")


_SOCKET_MESSAGE: dict[str, type[BaseModel]] = {"status": SocketStatus, "token": SocketToken, "done": SocketDone,
                                               "error": SocketError}


def socket_message(event: AnswerStatus | AnswerToken | AnswerDone | AnswerError, **envelope: Any) -> dict[str, Any]:
    """The socket's JSON for a chat event: the event's fields, the envelope's (side, id, extras) and no unset
    optional field, so each message carries only what applies to it."""
    message = _SOCKET_MESSAGE[event.type](**event.model_dump(), **envelope)
    return message.model_dump(mode="json", exclude_unset=True)


class ModelFileOut(BaseModel):
    """A side of the chat: the GGUF that answers, or why there is none (`code`, `reason`)."""
    available: bool
    gguf: str | None = None
    artifact_id: int | None = None
    size_bytes: int | None = None
    code: str | None = None
    reason: str | None = None


class PendingExport(BaseModel):
    job_id: int
    status: JobStatus


class PlaygroundJobOut(BaseModel):
    """A finished training job as the Playground page shows it: both sides and the export to ask for."""
    job_id: int
    name: str
    model: str
    status: JobStatus
    finished_at: UtcDateTime | None
    custom_chat_template: bool
    tuned: ModelFileOut
    base: ModelFileOut
    export_url: str
    pending_export: PendingExport | None


class EvaluationSample(BaseModel):
    prompt: str | None
    reference: str | None
    base_answer: str | None
    tuned_answer: str | None
    base_overlap: float | None
    tuned_overlap: float | None


class EvaluationScores(BaseModel):
    base_overlap: float
    tuned_overlap: float


class EvaluationOut(BaseModel):
    """The trained model against its base on held-out prompts (written at the end of an SFT job)."""
    status: Literal["running", "done", "failed"]
    error: str | None
    prompts_from: str | None
    base_eval_loss: float | None
    tuned_eval_loss: float | None
    samples: list[EvaluationSample]
    scores: EvaluationScores
