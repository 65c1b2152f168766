"""The team: admins create users and change roles; everyone can see who is on the team."""
from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from lanner.backend.deps import current_user, get_db, require_admin
from lanner.core.models import Role, User
from lanner.backend.schemas.common import SIGNED_IN_ERRORS, PathId, errors
from lanner.backend.schemas.accounts import NewTeamUser, UserOut, UserUpdate
from lanner.backend.security import hash_password

router = APIRouter(tags=["accounts"], responses=SIGNED_IN_ERRORS)


@router.get("/api/users", response_model=list[UserOut])
def list_users(_: User = Depends(current_user), session: Session = Depends(get_db)) -> list[User]:
    return list(session.scalars(select(User).order_by(User.id)))


@router.post("/api/users", response_model=UserOut, status_code=201, responses=errors(403, 409))
def create_user(body: NewTeamUser, _: User = Depends(require_admin), session: Session = Depends(get_db)) -> User:
    if session.scalar(select(User).where(User.email == body.email)) is not None:
        raise HTTPException(409, f"A user with the email {body.email} exists already")
    user = User(email=body.email, display_name=body.display_name, role=body.role,
                password_hash=hash_password(body.password))
    session.add(user)
    session.commit()
    return user


@router.patch("/api/users/{user_id}", response_model=UserOut, responses=errors(403, 404, 409))
def update_user(user_id: PathId, body: UserUpdate, admin: User = Depends(require_admin),
                session: Session = Depends(get_db)) -> User:
    user = session.get(User, user_id)
    if user is None:
        raise HTTPException(404, f"No user {user_id}")
    loses_admin = user.role == Role.admin and (body.role == Role.member or body.is_active is False)
    if loses_admin:
        admins = session.scalar(select(func.count()).select_from(User).where(
            User.role == Role.admin, User.is_active.is_(True)))
        if admins <= 1:
            raise HTTPException(409, "This is the last active admin: make another admin first")
    for field in ("display_name", "role", "is_active"):
        if getattr(body, field) is not None:
            setattr(user, field, getattr(body, field))
    if body.password is not None:
        user.password_hash = hash_password(body.password)
    session.commit()
    return user
