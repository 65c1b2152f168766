"""Bearer API tokens for scripts: created and shown once, listed, revoked, each by its owner."""
from __future__ import annotations

from datetime import datetime, timezone

from fastapi import APIRouter, Depends, HTTPException, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from lanner.backend.deps import current_user, get_db
from lanner.core.models import ApiToken, User
from lanner.backend.schemas.common import SIGNED_IN_ERRORS, PathId, errors
from lanner.backend.schemas.accounts import CreatedToken, NewToken, TokenOut
from lanner.backend.security import new_api_token, sha256_hex

router = APIRouter(tags=["accounts"], responses=SIGNED_IN_ERRORS)


@router.post("/api/tokens", response_model=CreatedToken, status_code=201)
def create_token(body: NewToken, user: User = Depends(current_user), session: Session = Depends(get_db)) -> dict:
    token = new_api_token()
    row = ApiToken(user_id=user.id, name=body.name, token_hash=sha256_hex(token), prefix=token[:12])
    session.add(row)
    session.commit()
    return {**TokenOut.model_validate(row).model_dump(), "token": token}


@router.get("/api/tokens", response_model=list[TokenOut])
def list_tokens(user: User = Depends(current_user), session: Session = Depends(get_db)) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).where(ApiToken.user_id == user.id).order_by(ApiToken.id)))


@router.delete("/api/tokens/{token_id}", status_code=204, responses=errors(404))
def revoke_token(token_id: PathId, user: User = Depends(current_user), session: Session = Depends(get_db)) -> Response:
    row = session.get(ApiToken, token_id)
    if row is None or row.user_id != user.id:  # another's token is as invisible as a missing one
        raise HTTPException(404, f"No token {token_id} of yours")
    if row.revoked_at is None:
        row.revoked_at = datetime.now(timezone.utc)
        session.commit()
    return Response(status_code=204)
