"""The playground's setting, read from the environment like lanner.backend.settings (README's table)."""
from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class PlaygroundSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LANNER_PLAYGROUND_", extra="ignore")

    cache_bytes: int = Field(default=8 * 1024**3, ge=0,
                             description="Memory the loaded GGUF models of the playground may take together")
