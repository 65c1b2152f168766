"""The playground's settings, read from the environment like lanner.core.settings (README's table)."""
from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class PlaygroundSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LANNER_PLAYGROUND_", extra="ignore")

    cache_bytes: int = Field(default=8 * 1024**3, ge=0,
                             description="Memory the loaded GGUF models of the playground may take together")
    contexts_per_model: int = Field(default=2, ge=1, le=8,
                                    description="Answers one loaded model streams at once (a KV cache each)")
    gpu_idle_seconds: int = Field(default=600, ge=10, le=86_400,
                                  description="A GPU chat session ends after this long without a question")
    cpu_extra_buffers: bool = Field(default=False, description="llama.cpp's AMX/repacked weight layouts (faster "
                                    "prompts; AMX kills the process in VMs that advertise it without enabling it)")
