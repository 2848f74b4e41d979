"""Reconciliation rebuilds turns that closed with no row: how far it has looked.

Revision ID: c5d2e8f1a3b7
Revises: b4e8f2a6c9d1
Create Date: 2026-12-08 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c5d2e8f1a3b7"
down_revision: str | None = "b4e8f2a6c9d1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rebuild_watermark",
        sa.Column("namespace", sa.String(length=255), nullable=False),
        sa.Column("task_queue", sa.String(length=255), nullable=False),
        sa.Column("closed_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("window_end", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resume_before", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "task_queue", name=op.f("pk_rebuild_watermark")),
    )


def downgrade() -> None:
    op.drop_table("rebuild_watermark")
