"""The turn's status indexed: background reconciliation looks for running turns each interval.

Revision ID: 62c752c2d2b5
Revises: d6c571d7496a
Create Date: 2026-12-02 05:55:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "62c752c2d2b5"
down_revision: str | None = "d6c571d7496a"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(op.f("ix_turn_status"), "turn", ["status"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_turn_status"), table_name="turn")
