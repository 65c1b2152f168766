"""SQLite: the ids the API shows are never given again after a delete (AUTOINCREMENT)

Without it SQLite gives a new row max(id) + 1, so deleting the newest job, dataset, user... hands its id
to the next one, and a bookmark, a live stream or a script holding the old id names the new row.
PostgreSQL's sequences never go back: nothing changes there.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""
from __future__ import annotations

from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

# The tables whose ids the API shows (job_metrics, device_samples and notification_deliveries are internal).
TABLES = ('users', 'api_tokens', 'datasets', 'sweeps', 'jobs', 'artifacts', 'webhooks')


def _recreate(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != 'sqlite':
        return
    for table in TABLES:  # copied into a new table (the migration's connection has foreign keys off)
        with op.batch_alter_table(table, recreate='always', table_kwargs={'sqlite_autoincrement': autoincrement}):
            pass


def upgrade() -> None:
    _recreate(True)


def downgrade() -> None:
    _recreate(False)
