"""Database engine and sessions. SQLite by default, PostgreSQL for teams; the schema is Alembic's."""
from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


class Base(DeclarativeBase):
    pass


@lru_cache
def get_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    # WAL lets the API read while a worker writes; foreign keys are off by default in SQLite.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url), expire_on_commit=False)


def sessions(url: str) -> Iterator[Session]:
    with session_factory(url)() as session:
        yield session


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def migrate(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def head_revision() -> str:
    return ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()


def current_revision(url: str) -> str | None:
    with get_engine(url).connect() as connection:
        connection.execute(text("SELECT 1"))
        return MigrationContext.configure(connection).get_current_revision()


CANNOT_CONNECT = "cannot connect"


def schema_problem(url: str) -> str | None:
    """Why the database at `url` cannot be used as it is, in words; None when it answers at the
    latest schema."""
    try:
        current = current_revision(url)
    except Exception as exc:  # any driver error means "down"
        return f"{CANNOT_CONNECT}: {exc.__class__.__name__}: {exc}"
    head = head_revision()
    if current != head:
        return f"schema at {current}, expected {head}: run `lanner migrate`"
    return None


# `%` and `_` typed by a person are letters to search for, not LIKE wildcards.
LIKE_ESCAPE = "\\"


def like_literal(text: str) -> str:
    """`text` escaped for a LIKE pattern with ESCAPE LIKE_ESCAPE."""
    return text.replace(LIKE_ESCAPE, LIKE_ESCAPE * 2).replace("%", LIKE_ESCAPE + "%").replace("_", LIKE_ESCAPE + "_")
