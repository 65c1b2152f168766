"""sweeps, and jobs.sweep_id: the sweep a training job is a run of

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('sweeps',
                    sa.Column('id', sa.Integer(), nullable=False),
                    sa.Column('owner_id', sa.Integer(), nullable=False),
                    sa.Column('name', sa.String(length=200), nullable=False),
                    sa.Column('config', sa.JSON(), nullable=False),
                    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
                    sa.Column('cancelled_at', sa.DateTime(timezone=True), nullable=True),
                    sa.ForeignKeyConstraint(['owner_id'], ['users.id'], ondelete='CASCADE'),
                    sa.PrimaryKeyConstraint('id'))
    op.create_index('ix_sweeps_owner_id', 'sweeps', ['owner_id'])
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('sweep_id', sa.Integer(), nullable=True))
        batch.create_foreign_key('fk_jobs_sweep_id_sweeps', 'sweeps', ['sweep_id'], ['id'], ondelete='SET NULL')
        batch.create_index('ix_jobs_sweep_id', ['sweep_id'])


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_index('ix_jobs_sweep_id')
        batch.drop_constraint('fk_jobs_sweep_id_sweeps', type_='foreignkey')
        batch.drop_column('sweep_id')
    op.drop_index('ix_sweeps_owner_id', table_name='sweeps')
    op.drop_table('sweeps')
