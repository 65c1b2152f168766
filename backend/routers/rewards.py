"""GRPO's reward functions: tried on sample completions before a job is launched."""
from __future__ import annotations

from fastapi import APIRouter, Depends
from sqlalchemy.orm import Session

from lanner.backend.deps import current_user, get_db, per_user
from lanner.backend.schemas.common import SIGNED_IN_ERRORS, errors
from lanner.backend.schemas.rewards import RewardTest, RewardTestResult
from lanner.backend.services import rewards
from lanner.core.models import User
from lanner.core.settings import Settings, get_settings

router = APIRouter(tags=["rewards"], responses=SIGNED_IN_ERRORS)


@router.post("/api/rewards/test", response_model=RewardTestResult, dependencies=[per_user("previews")],
             responses=errors(404))
def test_rewards(test: RewardTest, user: User = Depends(current_user), session: Session = Depends(get_db),
                 settings: Settings = Depends(get_settings)) -> RewardTestResult:
    """Runs the reward functions on the completions in the reward sandbox (a subprocess with limits:
    docs/rewards.md). A function that fails answers 200 with the failure and its traceback."""
    return rewards.try_rewards(session, settings, test)
