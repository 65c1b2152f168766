from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from lanner.core.spec import RewardFunctions

MAX_TEST_ROWS = 32


class RewardTest(BaseModel):
    """Reward functions tried on completions written for the test, each paired in turn with a row of
    the dataset (its prompt and reference columns) when one is given."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    reward_functions: RewardFunctions
    completions: list[str] = Field(min_length=1, max_length=MAX_TEST_ROWS, description="Sample completions")
    dataset_id: int | None = Field(default=None, ge=1, le=2**31 - 1, description="A prompt dataset: its first rows")
    timeout_s: float = Field(default=10, gt=0, le=60, description="The sandbox's time limit for the batch")


class RewardTestRow(BaseModel):
    prompt: str
    completion: str
    rewards: dict[str, float | None]
    total: float | None = Field(description="The weighted sum, as GRPO scores the completion; None if no function gave one")


class RewardFailure(BaseModel):
    function: str | None
    message: str
    traceback: str
    output: str = Field(description="What the functions printed (its end)")


class RewardTestResult(BaseModel):
    rows: list[RewardTestRow]
    failure: RewardFailure | None = None
    network_isolated: bool = Field(description="Whether the sandbox ran without network on this machine")
