"""First-run setup, sign-in and sign-out, and the signed-in user."""
from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from redis import Redis
from sqlalchemy.orm import Session

from lanner.backend.deps import client_address, current_user, get_db, per_client, redis_client
from lanner.backend.services import accounts
from lanner.core.models import User
from lanner.backend.schemas.accounts import NewUser, OwnUpdate, SetupState, SignIn, UserOut
from lanner.backend.schemas.common import SIGNED_IN_ERRORS, errors
from lanner.backend.security import SESSION_COOKIE, close_session, open_session
from lanner.core.settings import Settings, get_settings

router = APIRouter(tags=["accounts"])


def _sign_in(response: Response, request: Request, redis: Redis, user: User, settings: Settings) -> None:
    token = open_session(redis, user.id, settings.session_days)
    response.set_cookie(SESSION_COOKIE, token, max_age=settings.session_days * 86400, path="/",
                        httponly=True, samesite="lax", secure=request.url.scheme == "https")


@router.get("/api/setup", response_model=SetupState)
def setup_state(session: Session = Depends(get_db)) -> SetupState:
    return SetupState(needed=not accounts.has_users(session))


@router.post("/api/setup", response_model=UserOut, status_code=201, dependencies=[per_client("sign_ins")],
             responses=errors(409, 422, 429))
def setup(body: NewUser, request: Request, response: Response, session: Session = Depends(get_db),
          redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> User:
    """Creates the first admin and signs them in; refused once any user exists."""
    user = accounts.create_first_admin(session, redis, body)
    _sign_in(response, request, redis, user, settings)
    return user


@router.post("/api/auth/sign-in", response_model=UserOut, dependencies=[per_client("sign_ins")],
             responses={**errors(422, 429), 401: {**errors(401)[401], "description": "Wrong email or password"}})
def sign_in(body: SignIn, request: Request, response: Response, session: Session = Depends(get_db),
            redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> User:
    email, client = body.email.strip().lower(), client_address(request)
    wait = accounts.sign_in_wait(redis, client, email)
    if wait is not None:
        raise HTTPException(429, f"Too many failed sign-ins for {email} from here: try again in {wait} s",
                            headers={"Retry-After": str(wait)})
    user = accounts.check_password(session, redis, client, email, body.password)
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
def update_me(body: OwnUpdate, request: Request, user: User = Depends(current_user),
              session: Session = Depends(get_db), redis: Redis = Depends(redis_client)) -> User:
    """Changes one's own display name or password (the current password is needed for the latter)."""
    return accounts.update_own(session, redis, user, body, own_session=request.cookies.get(SESSION_COOKIE))
