"""`lanner admin`: an operator's way back in when the API cannot help, e.g. no active admin is left
(setup is refused once users exist). Changes the database directly, through the same service as the API."""
from __future__ import annotations

import getpass
import sys

from redis.exceptions import RedisError

from lanner.backend.schemas.accounts import UserUpdate
from lanner.backend.services import accounts
from lanner.core import db
from lanner.core.errors import UserError
from lanner.core.models import Role
from lanner.core.redis_client import get_redis
from lanner.core.settings import Settings


def _new_password() -> str:
    """From the terminal (asked twice), or the first line of standard input when it is not one."""
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\n")
    password = getpass.getpass("New password: ")
    if getpass.getpass("Again: ") != password:
        raise SystemExit("The passwords differ; nothing was changed.")
    return password


def run(settings: Settings, action: str, email: str) -> None:
    try:
        change = UserUpdate(role=Role.admin, is_active=True) if action == "promote" else \
                 UserUpdate(password=_new_password())
    except ValueError as error:
        raise SystemExit(f"Nothing was changed: {error}") from None
    with db.session_factory(settings.database_url)() as session:
        try:
            user = accounts.user_by_email(session, email)
            accounts.update_user(session, get_redis(settings.redis_url), user.id, change)
        except UserError as error:
            raise SystemExit(error.message) from None
        except RedisError:  # the change is committed; sessions could not be ended while Redis is away
            print("Redis did not answer: the user's open sessions were not ended.", file=sys.stderr)
    done = "is an active admin" if action == "promote" else "has the new password"
    print(f"{user.email} {done}.")
