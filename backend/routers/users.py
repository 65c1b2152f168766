"""The team: admins create users and change roles; everyone can see who is on the team."""
from __future__ import annotations

from fastapi import APIRouter, Depends
from redis import Redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from lanner.backend.deps import current_user, get_db, redis_client, require_admin
from lanner.backend.services import accounts
from lanner.core.models import User
from lanner.backend.schemas.common import SIGNED_IN_ERRORS, PathId, errors
from lanner.backend.schemas.accounts import NewTeamUser, UserOut, UserUpdate

router = APIRouter(tags=["accounts"], responses=SIGNED_IN_ERRORS)


@router.get("/api/users", response_model=list[UserOut])
def list_users(_: User = Depends(current_user), session: Session = Depends(get_db)) -> list[User]:
    return list(session.scalars(select(User).order_by(User.id)))


@router.post("/api/users", response_model=UserOut, status_code=201, responses=errors(403, 409))
def create_user(body: NewTeamUser, _: User = Depends(require_admin), session: Session = Depends(get_db)) -> User:
    return accounts.create_user(session, body)


@router.patch("/api/users/{user_id}", response_model=UserOut, responses=errors(403, 404, 409))
def update_user(user_id: PathId, body: UserUpdate, admin: User = Depends(require_admin),
                session: Session = Depends(get_db), redis: Redis = Depends(redis_client)) -> User:
    return accounts.update_user(session, redis, user_id, body)
