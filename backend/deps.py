"""FastAPI dependencies: the database session, Redis, and the signed-in user (cookie or bearer)."""
from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

from fastapi import Depends, HTTPException, Request, WebSocket
from redis import Redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from lanner.core import db
from lanner.core.errors import UserError
from lanner.core.models import ApiToken, Role, User
from lanner.backend.rate_limits import charge
from lanner.core.redis_client import get_redis
from lanner.backend.security import API_TOKEN_PREFIX, SESSION_COOKIE, is_same_origin, session_user_id, sha256_hex
from lanner.core.settings import Settings, get_settings

# WebSocket close codes of every socket: 4401 not signed in, 4404 no such job, 4422 bad input.
WS_UNAUTHORISED, WS_NOT_FOUND, WS_BAD_REQUEST = 4401, 4404, 4422


def get_db(settings: Settings = Depends(get_settings)) -> Iterator[Session]:
    yield from db.sessions(settings.database_url)


def redis_client(settings: Settings = Depends(get_settings)) -> Redis:
    return get_redis(settings.redis_url)


def _user_from_api_token(session: Session, token: str) -> User | None:
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == sha256_hex(token),
                                                ApiToken.revoked_at.is_(None)))
    if row is None:
        return None
    now = datetime.now(timezone.utc)
    last = row.last_used_at
    if last is not None and last.tzinfo is None:  # SQLite hands back naive datetimes
        last = last.replace(tzinfo=timezone.utc)
    if last is None or now - last > timedelta(minutes=1):  # one write a minute, not one per request
        row.last_used_at = now
        session.commit()
    return session.get(User, row.user_id)


def authenticate(session: Session, redis: Redis, cookie: str | None, bearer: str | None) -> User | None:
    """The user behind a bearer API token or a session cookie; None when neither is valid."""
    user = None
    if bearer:
        user = _user_from_api_token(session, bearer) if bearer.startswith(API_TOKEN_PREFIX) else None
    elif cookie:
        user_id = session_user_id(redis, cookie)
        user = session.get(User, user_id) if user_id is not None else None
    return user if user is not None and user.is_active else None


def _bearer(authorization: str | None) -> str | None:
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return None


def current_user(request: Request, session: Session = Depends(get_db), redis: Redis = Depends(redis_client),
                 settings: Settings = Depends(get_settings)) -> User:
    """The signed-in user, counted against their requests_per_minute."""
    authorization = request.headers.get("authorization")
    bearer = _bearer(authorization)
    if authorization and not bearer:
        raise HTTPException(401, "Authorization must be 'Bearer <token>'", headers={"WWW-Authenticate": "Bearer"})
    user = authenticate(session, redis, request.cookies.get(SESSION_COOKIE), bearer)
    if user is None:
        raise HTTPException(401, "Sign in first (session cookie or bearer API token)",
                            headers={"WWW-Authenticate": "Bearer"})
    charge(redis, "requests", f"user:{user.id}", settings.requests_per_minute)
    return user


def signed_in_or_none(request: Request, settings: Settings) -> User | None:
    """The signed-in user, or None when the request is anonymous or the database or Redis cannot
    tell (for routes that answer everyone, in more detail to a signed-in user)."""
    try:
        with db.session_factory(settings.database_url)() as session:
            return authenticate(session, get_redis(settings.redis_url), request.cookies.get(SESSION_COOKIE),
                                _bearer(request.headers.get("authorization")))
    except Exception:  # a part that is down makes the request anonymous, which health then reports
        return None


def require_admin(user: User = Depends(current_user)) -> User:
    if user.role != Role.admin:
        raise HTTPException(403, "Only an admin may do this")
    return user


def may_manage(user: User, owner_id: int) -> bool:
    """Members act on their own jobs and datasets only; admins on everyone's."""
    return user.role == Role.admin or user.id == owner_id


def require_owner_or_admin(user: User, owner_id: int, what: str) -> None:
    if not may_manage(user, owner_id):
        raise UserError(403, f"Only its owner or an admin may {what}")


def websocket_user(websocket: WebSocket, session: Session, redis: Redis) -> User | None:
    """WebSockets sign in like REST: the session cookie (same origin only, against cross-site
    WebSocket hijacking) or an API token in the `token` query parameter or the Authorization header."""
    bearer = websocket.query_params.get("token") or _bearer(websocket.headers.get("authorization"))
    cookie = websocket.cookies.get(SESSION_COOKIE)
    origin = websocket.headers.get("origin")
    if cookie and not bearer and origin and not is_same_origin(origin, websocket.headers.get("host", "")):
        return None
    return authenticate(session, redis, cookie, bearer)


def per_user(bucket: str):
    """A rate limit for a route: `dependencies=[per_user("uploads")]` allows settings.uploads_per_minute."""
    def limit(user: User = Depends(current_user), redis: Redis = Depends(redis_client),
              settings: Settings = Depends(get_settings)) -> None:
        charge(redis, bucket, f"user:{user.id}", getattr(settings, f"{bucket}_per_minute"))

    return Depends(limit)


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def per_client(bucket: str):
    """A rate limit for routes used before sign-in, counted per client address."""
    def limit(request: Request, redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> None:
        charge(redis, bucket, f"client:{client_address(request)}", getattr(settings, f"{bucket}_per_minute"))

    return Depends(limit)
