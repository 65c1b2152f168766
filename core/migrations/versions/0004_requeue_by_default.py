"""a job whose worker is lost is queued again by default: spec version 2, and jobs.requeues

Version 2 of the stored spec turns `requeue_on_worker_loss` on by default. Every version 1 spec that
does not say it (some that 0003 rewrote from the old nested shape) is given the old default, false,
so that a job stored before keeps meaning what it meant; one that says it keeps its value.
`jobs.requeues` counts the times a job went back to the queue after its worker was lost.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-09
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

jobs = sa.table("jobs", sa.column("id", sa.Integer), sa.column("kind", sa.String), sa.column("config", sa.JSON))


def _rewrite(old: int, new: int, change) -> None:
    connection = op.get_bind()
    for job in connection.execute(sa.select(jobs).where(jobs.c.kind == "train")).all():
        config = job.config or {}
        if set(config) == {"version", "spec"} and config["version"] == old:
            connection.execute(jobs.update().where(jobs.c.id == job.id)
                               .values(config={"version": new, "spec": change(dict(config["spec"]))}))


def upgrade() -> None:
    op.add_column("jobs", sa.Column("requeues", sa.Integer(), nullable=False, server_default="0"))
    _rewrite(1, 2, lambda spec: {"requeue_on_worker_loss": False, **spec})


def downgrade() -> None:
    _rewrite(2, 1, lambda spec: spec)
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("requeues")
