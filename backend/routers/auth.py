"""First-run setup, sign-in and sign-out, and the signed-in user."""
from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from redis import Redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from lanner.backend.deps import current_user, get_db, per_client, redis_client
from lanner.core.models import Role, User
from lanner.backend.schemas.accounts import NewUser, OwnUpdate, SetupState, SignIn, UserOut
from lanner.backend.schemas.common import SIGNED_IN_ERRORS, errors
from lanner.backend.security import (SESSION_COOKIE, close_session, hash_password, open_session,
                                     verify_password)
from lanner.core.settings import Settings, get_settings

router = APIRouter(tags=["accounts"])
_SETUP_LOCK = "lanner:setup-lock"
# Password guessing: after this many failures for one email, sign-in waits out the window.
FAILURES_ALLOWED = 10
FAILURE_WINDOW_SECONDS = 15 * 60
_FAILURES = "lanner:sign-in-failures:"
# Verified against when the email is unknown, so a wrong email costs as long as a wrong password.
_DUMMY_HASH: list[str] = []


def _has_users(session: Session) -> bool:
    return session.scalar(select(func.count()).select_from(User)) > 0


def _sign_in(response: Response, request: Request, redis: Redis, user: User, settings: Settings) -> None:
    token = open_session(redis, user.id, settings.session_days)
    response.set_cookie(SESSION_COOKIE, token, max_age=settings.session_days * 86400, path="/",
                        httponly=True, samesite="lax", secure=request.url.scheme == "https")


@router.get("/api/setup", response_model=SetupState)
def setup_state(session: Session = Depends(get_db)) -> SetupState:
    return SetupState(needed=not _has_users(session))


@router.post("/api/setup", response_model=UserOut, status_code=201, dependencies=[per_client("sign_ins")],
             responses=errors(409, 422, 429))
def setup(body: NewUser, request: Request, response: Response, session: Session = Depends(get_db),
          redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> User:
    """Creates the first admin and signs them in; refused once any user exists."""
    if _has_users(session) or not redis.set(_SETUP_LOCK, "1", nx=True, ex=30):
        raise HTTPException(409, "Setup is already done: sign in, or ask an admin for an account")
    try:
        if _has_users(session):
            raise HTTPException(409, "Setup is already done: sign in, or ask an admin for an account")
        user = User(email=body.email, display_name=body.display_name, role=Role.admin,
                    password_hash=hash_password(body.password))
        session.add(user)
        session.commit()
    finally:
        redis.delete(_SETUP_LOCK)
    _sign_in(response, request, redis, user, settings)
    return user


@router.post("/api/auth/sign-in", response_model=UserOut, dependencies=[per_client("sign_ins")],
             responses={**errors(422, 429), 401: {**errors(401)[401], "description": "Wrong email or password"}})
def sign_in(body: SignIn, request: Request, response: Response, session: Session = Depends(get_db),
            redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> User:
    email = body.email.strip().lower()
    failures_key = _FAILURES + email
    failures = int(redis.get(failures_key) or 0)
    if failures >= FAILURES_ALLOWED:
        wait = max(redis.ttl(failures_key), 1)
        raise HTTPException(429, f"Too many failed sign-ins for {email}: try again in {wait} s",
                            headers={"Retry-After": str(wait)})
    user = session.scalar(select(User).where(User.email == email))
    if user is None:
        if not _DUMMY_HASH:
            _DUMMY_HASH.append(hash_password("not a password"))
        verify_password(body.password, _DUMMY_HASH[0])
    if user is None or not verify_password(body.password, user.password_hash) or not user.is_active:
        with redis.pipeline() as pipe:
            pipe.incr(failures_key).expire(failures_key, FAILURE_WINDOW_SECONDS).execute()
        raise HTTPException(401, "Wrong email or password")
    redis.delete(failures_key)
    _sign_in(response, request, redis, user, settings)
    return user


@router.post("/api/auth/sign-out", status_code=204)
def sign_out(request: Request, redis: Redis = Depends(redis_client)) -> Response:
    """Ends the browser session (works signed out too, so a stale tab can always sign out)."""
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        close_session(redis, token)
    response = Response(status_code=204)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="lax")
    return response


@router.get("/api/me", response_model=UserOut, responses=SIGNED_IN_ERRORS)
def me(user: User = Depends(current_user)) -> User:
    return user


@router.patch("/api/me", response_model=UserOut, responses={**SIGNED_IN_ERRORS, **errors(403)})
def update_me(body: OwnUpdate, user: User = Depends(current_user), session: Session = Depends(get_db)) -> User:
    """Changes one's own display name or password (the current password is needed for the latter)."""
    if body.role is not None or body.is_active is not None:
        raise HTTPException(403, "Only an admin may change roles or deactivate accounts (PATCH /api/users/{id})")
    if body.password is not None:
        if not body.current_password or not verify_password(body.current_password, user.password_hash):
            raise HTTPException(403, "current_password is wrong or missing")
        user.password_hash = hash_password(body.password)
    if body.display_name is not None:
        user.display_name = body.display_name
    session.commit()
    return user
