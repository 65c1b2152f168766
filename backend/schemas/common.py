"""Types shared by the routers."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any

from fastapi import Path, Query
from pydantic import AfterValidator, BaseModel, Field

# Ids fit PostgreSQL's 32-bit integer keys; a bigger number is a 422, not a driver overflow.
MAX_ID = 2**31 - 1
PathId = Annotated[int, Path(ge=1, le=MAX_ID)]
QueryId = Annotated[int | None, Query(ge=1, le=MAX_ID)]
Offset = Annotated[int, Query(ge=0, le=MAX_ID)]
# Times are UTC; SQLite hands them back without a zone, which would read as local time in a browser.
UtcDateTime = Annotated[datetime, AfterValidator(lambda value: value if value.tzinfo else value.replace(tzinfo=timezone.utc))]


class ValidationIssue(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorOut(BaseModel):
    """Every error: a sentence, or for a request that fails validation one entry per field."""
    detail: str | list[ValidationIssue]
    report: dict[str, Any] | None = Field(default=None, description="A refused dataset upload's validation report")


_MEANINGS = {
    401: "Not signed in (no valid session cookie or bearer API token)",
    403: "Signed in, but not allowed: only the owner or an admin may",
    404: "No such resource",
    409: "Not possible in the resource's current state",
    413: "The request body is over its limit",
    415: "An unsupported file type",
    416: "The byte range cannot be served",
    422: "Invalid input: one entry per field, or a sentence",
    429: "Too many requests: wait Retry-After seconds",
    502: "The model hub gave an answer that cannot be used",
    503: "Offline: the model hub cannot be reached from this machine",
    507: "Not enough free disk space",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses, each with the ErrorOut body."""
    return {code: {"model": ErrorOut, "description": _MEANINGS[code]} for code in codes}


# What every route that needs a signed-in user can answer.
SIGNED_IN_ERRORS = errors(401, 422, 429)
