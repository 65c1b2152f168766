"""What the playground takes: the socket's generate request and the GPU session's options."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lanner.backend.schemas.common import MAX_ID
from lanner.core.messages.chat import Side
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
