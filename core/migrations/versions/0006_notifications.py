"""webhooks, notification deliveries, and users.email_notifications

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('users') as batch:
        batch.add_column(sa.Column('email_notifications', sa.Boolean(), server_default=sa.false(), nullable=False))
    op.create_table('webhooks',
                    sa.Column('id', sa.Integer(), nullable=False),
                    sa.Column('user_id', sa.Integer(), nullable=False),
                    sa.Column('url', sa.String(length=2048), nullable=False),
                    sa.Column('secret', sa.String(length=128), nullable=False),
                    sa.Column('events', sa.JSON(), nullable=False),
                    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
                    sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='CASCADE'),
                    sa.PrimaryKeyConstraint('id'))
    op.create_index('ix_webhooks_user_id', 'webhooks', ['user_id'])
    op.create_table('notification_deliveries',
                    sa.Column('id', sa.Integer(), nullable=False),
                    sa.Column('user_id', sa.Integer(), nullable=False),
                    sa.Column('webhook_id', sa.Integer(), nullable=True),
                    sa.Column('job_id', sa.Integer(), nullable=True),
                    sa.Column('event', sa.String(length=16), nullable=False),
                    sa.Column('payload', sa.JSON(), nullable=False),
                    sa.Column('state', sa.String(length=16), nullable=False),
                    sa.Column('attempts', sa.Integer(), nullable=False),
                    sa.Column('status_code', sa.Integer(), nullable=True),
                    sa.Column('error', sa.Text(), nullable=True),
                    sa.Column('next_try_at', sa.DateTime(timezone=True), nullable=True),
                    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
                    sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
                    sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='CASCADE'),
                    sa.ForeignKeyConstraint(['webhook_id'], ['webhooks.id'], ondelete='CASCADE'),
                    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='SET NULL'),
                    sa.PrimaryKeyConstraint('id'))
    op.create_index('ix_notification_deliveries_user_id', 'notification_deliveries', ['user_id'])
    op.create_index('ix_notification_deliveries_webhook_id', 'notification_deliveries', ['webhook_id'])
    op.create_index('ix_notification_deliveries_due', 'notification_deliveries', ['state', 'next_try_at'])


def downgrade() -> None:
    op.drop_index('ix_notification_deliveries_due', table_name='notification_deliveries')
    op.drop_index('ix_notification_deliveries_webhook_id', table_name='notification_deliveries')
    op.drop_index('ix_notification_deliveries_user_id', table_name='notification_deliveries')
    op.drop_table('notification_deliveries')
    op.drop_index('ix_webhooks_user_id', table_name='webhooks')
    op.drop_table('webhooks')
    with op.batch_alter_table('users') as batch:
        batch.drop_column('email_notifications')
