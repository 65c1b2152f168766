"""Alembic owns the schema, on SQLite and on PostgreSQL alike."""
from __future__ import annotations

from sqlalchemy import inspect

from lanner.core import db


def test_migrations_go_up_and_down(database_url):
    assert db.current_revision(database_url) is None
    db.migrate(database_url)
    assert db.current_revision(database_url) == db.head_revision()
    assert {"users", "jobs", "datasets", "artifacts", "job_metrics", "device_samples", "api_tokens"} <= set(
        inspect(db.get_engine(database_url)).get_table_names())
    db.migrate(database_url)  # running it twice is safe
    from alembic import command

    command.downgrade(db.alembic_config(database_url), "base")
    assert "users" not in inspect(db.get_engine(database_url)).get_table_names()
    db.get_engine(database_url).dispose()


def test_the_models_match_the_migrations(database_url):
    """A model change without its migration shows up here as a difference."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    db.migrate(database_url)
    with db.get_engine(database_url).connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), db.Base.metadata)
    db.get_engine(database_url).dispose()
    assert differences == []
