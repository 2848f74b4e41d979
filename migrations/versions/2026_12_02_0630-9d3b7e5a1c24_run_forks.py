"""Links between an agent run and the run forked from it.

Revision ID: 9d3b7e5a1c24
Revises: f796bcc3b7d8
Create Date: 2026-12-02 06:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9d3b7e5a1c24"
down_revision: str | None = "f796bcc3b7d8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_fork",
        sa.Column("run_id", sa.String(length=255), nullable=False),
        sa.Column("source_run_id", sa.String(length=255), nullable=False),
        sa.Column("from_turn", sa.Integer(), nullable=False),
        sa.Column("message_replaced", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_run_fork")),
    )
    op.create_index(op.f("ix_run_fork_source_run_id"), "run_fork", ["source_run_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_run_fork_source_run_id"), table_name="run_fork")
    op.drop_table("run_fork")
