"""Signed approvals taken up, once per signature across the runs of a turn.

Revision ID: a7c3d9e2f104
Revises: 3e8a51c7d2f6
Create Date: 2026-12-05 17:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a7c3d9e2f104"
down_revision: str | None = "3e8a51c7d2f6"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "approval_use",
        # SHA-256 of the decoded signature: one row per signature, however it is spelled.
        sa.Column("signature_sha256", sa.String(length=64), nullable=False),
        sa.Column("turn_id", sa.Text(), nullable=False),
        sa.Column("run_id", sa.String(length=255), nullable=False),
        sa.Column("tool_call_id", sa.Text(), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("signature_sha256", name=op.f("pk_approval_use")),
    )


def downgrade() -> None:
    op.drop_table("approval_use")
