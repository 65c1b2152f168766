"""Users, sign-in and API tokens."""
from __future__ import annotations


from pydantic import BaseModel, ConfigDict, Field, field_validator

from lanner.core.models import Role
from lanner.backend.security import MIN_PASSWORD_LENGTH
from lanner.backend.schemas.common import UtcDateTime


def _email(value: str) -> str:
    value = value.strip().lower()
    local, _, domain = value.partition("@")
    if not local or not domain or " " in value:
        raise ValueError("must be an email address like ada@example.com")
    return value


class NewUser(BaseModel):
    email: str = Field(max_length=320)
    display_name: str = Field(min_length=1, max_length=200)
    password: str = Field(min_length=MIN_PASSWORD_LENGTH, max_length=1024)

    _check_email = field_validator("email")(_email)


class NewTeamUser(NewUser):
    role: Role = Role.member


class UserUpdate(BaseModel):
    display_name: str | None = Field(default=None, min_length=1, max_length=200)
    role: Role | None = None
    is_active: bool | None = None
    password: str | None = Field(default=None, min_length=MIN_PASSWORD_LENGTH, max_length=1024)


class OwnUpdate(UserUpdate):
    """PATCH /api/me: one's own display name or password; a new password needs the current one."""
    current_password: str | None = None


class SignIn(BaseModel):
    email: str = Field(max_length=320)
    password: str = Field(max_length=1024)


class UserOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    email: str
    display_name: str
    role: Role
    is_active: bool
    created_at: UtcDateTime


class SetupState(BaseModel):
    needed: bool


class NewToken(BaseModel):
    name: str = Field(min_length=1, max_length=200)


class TokenOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    prefix: str
    created_at: UtcDateTime
    last_used_at: UtcDateTime | None
    revoked_at: UtcDateTime | None


class CreatedToken(TokenOut):
    token: str = Field(description="The token itself: shown this once, only its SHA-256 is kept")
