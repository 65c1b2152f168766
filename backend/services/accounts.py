"""Accounts: the first admin, password sign-in with its lockout, one's own changes, the team's users
(the last active admin stays one). Refusals are UserErrors; cookies and headers are the routers'."""
from __future__ import annotations

from redis import Redis
from sqlalchemy import false, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from lanner.backend.schemas.accounts import NewTeamUser, NewUser, OwnUpdate, UserUpdate
from lanner.backend.security import close_sessions_of, hash_password, verify_password
from lanner.core.errors import UserError
from lanner.core.models import Role, User

SETUP_LOCK = "lanner:setup-lock"
SETUP_DONE = "Setup is already done: sign in, or ask an admin for an account"
# Password guessing: after this many failures for one email from one client address, sign-in from
# that address waits out the window. Per address too, so a stranger's guesses cannot lock the owner
# out; guessing from many addresses is slowed by the per-address rate limit on sign-in.
FAILURES_ALLOWED = 10
FAILURE_WINDOW_SECONDS = 15 * 60
_FAILURES = "lanner:sign-in-failures:"
# Verified against when the email is unknown, so a wrong email costs as long as a wrong password.
_DUMMY_HASH: list[str] = []


def has_users(session: Session) -> bool:
    return session.scalar(select(func.count()).select_from(User)) > 0


def create_first_admin(session: Session, redis: Redis, body: NewUser) -> User:
    """The first user, an admin; refused once any user exists (a short lock keeps two setups at once
    from making two admins)."""
    if has_users(session) or not redis.set(SETUP_LOCK, "1", nx=True, ex=30):
        raise UserError(409, SETUP_DONE)
    try:
        if has_users(session):
            raise UserError(409, SETUP_DONE)
        user = User(email=body.email, display_name=body.display_name, role=Role.admin,
                    password_hash=hash_password(body.password))
        session.add(user)
        session.commit()
        return user
    finally:
        redis.delete(SETUP_LOCK)


def _failures_key(client: str, email: str) -> str:
    return f"{_FAILURES}{client}:{email}"


def sign_in_wait(redis: Redis, client: str, email: str) -> int | None:
    """Seconds until `email` may try again from `client`, once it failed FAILURES_ALLOWED times from
    there; None while it may."""
    key = _failures_key(client, email)
    if int(redis.get(key) or 0) < FAILURES_ALLOWED:
        return None
    return max(redis.ttl(key), 1)


def check_password(session: Session, redis: Redis, client: str, email: str, password: str) -> User:
    """The active user with this email and password; a failure counts towards the lockout of this
    email from this client address."""
    failures = _failures_key(client, email)
    user = session.scalar(select(User).where(User.email == email))
    if user is None:
        if not _DUMMY_HASH:
            _DUMMY_HASH.append(hash_password("not a password"))
        verify_password(password, _DUMMY_HASH[0])
    if user is None or not verify_password(password, user.password_hash) or not user.is_active:
        with redis.pipeline() as pipe:
            pipe.incr(failures).expire(failures, FAILURE_WINDOW_SECONDS).execute()
        raise UserError(401, "Wrong email or password")
    redis.delete(failures)
    return user


def update_own(session: Session, redis: Redis, user: User, body: OwnUpdate, own_session: str | None) -> User:
    """One's own display name or password (the current password is needed for the latter). A new
    password ends every other session of the user: `own_session`, the token it came with, stays."""
    if body.role is not None or body.is_active is not None:
        raise UserError(403, "Only an admin may change roles or deactivate accounts (PATCH /api/users/{id})")
    if body.password is not None:
        if not body.current_password or not verify_password(body.current_password, user.password_hash):
            raise UserError(403, "current_password is wrong or missing")
        user.password_hash = hash_password(body.password)
    if body.display_name is not None:
        user.display_name = body.display_name
    session.commit()
    if body.password is not None:
        close_sessions_of(redis, user.id, keep=own_session)
    return user


def user_by_email(session: Session, email: str) -> User:
    user = session.scalar(select(User).where(User.email == email.strip().lower()))
    if user is None:
        raise UserError(404, f"No user with the email {email}")
    return user


def create_user(session: Session, body: NewTeamUser) -> User:
    taken = UserError(409, f"A user with the email {body.email} exists already")
    if session.scalar(select(User).where(User.email == body.email)) is not None:
        raise taken
    user = User(email=body.email, display_name=body.display_name, role=body.role,
                password_hash=hash_password(body.password))
    session.add(user)
    try:
        session.commit()
    except IntegrityError:  # the same email created by another request since the check above
        session.rollback()
        raise taken from None
    return user


def _active_admins_locked(session: Session) -> list[int]:
    """The active admins' ids, read so that two changes at once cannot both take the last-but-one
    admin: on PostgreSQL the rows stay locked (FOR UPDATE) until commit, so a second change waits
    and then sees what the first left; SQLite has one writer at a time, and a write that changes
    nothing takes that turn before the count is read."""
    if session.get_bind().dialect.name == "sqlite":
        session.execute(update(User).where(false()).values(role=User.role))
    return list(session.scalars(select(User.id).where(User.role == Role.admin, User.is_active.is_(True))
                                .with_for_update()))


def update_user(session: Session, redis: Redis, user_id: int, body: UserUpdate) -> User:
    """An admin's change of a user; the last active admin is neither demoted nor deactivated. A reset
    password or a deactivation ends the user's sessions."""
    loses_admin = body.role == Role.member or body.is_active is False
    admins = _active_admins_locked(session) if loses_admin else []
    user = session.get(User, user_id, populate_existing=True)
    if user is None:
        raise UserError(404, f"No user {user_id}")
    if loses_admin and user.id in admins and len(admins) <= 1:
        raise UserError(409, "This is the last active admin: make another admin first")
    for field in ("display_name", "role", "is_active"):
        if getattr(body, field) is not None:
            setattr(user, field, getattr(body, field))
    if body.password is not None:
        user.password_hash = hash_password(body.password)
    session.commit()
    if body.password is not None or body.is_active is False:
        close_sessions_of(redis, user.id)
    return user
