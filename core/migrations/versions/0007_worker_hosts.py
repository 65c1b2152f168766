"""jobs.host and jobs.worker_instance: where a job runs, and which process of its worker claimed it

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('host', sa.String(length=255), nullable=True))
        batch.add_column(sa.Column('worker_instance', sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('worker_instance')
        batch.drop_column('host')
