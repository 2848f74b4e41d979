"""Approval rejections: approvals a turn's validator refused, recorded by the client.

Revision ID: 5c9ef3414ea9
Revises: 62c752c2d2b5
Create Date: 2026-12-02 05:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5c9ef3414ea9"
down_revision: str | None = "62c752c2d2b5"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "approval_rejection",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("turn_id", sa.Text(), nullable=False),
        sa.Column("tool_call_id", sa.Text(), nullable=False),
        sa.Column("approver", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_approval_rejection")),
    )
    op.create_index(
        op.f("ix_approval_rejection_turn_id"), "approval_rejection", ["turn_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_approval_rejection_turn_id"), table_name="approval_rejection")
    op.drop_table("approval_rejection")
