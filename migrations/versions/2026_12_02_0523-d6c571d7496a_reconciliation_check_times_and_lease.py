"""Reconciliation: when a running turn was last checked, and the one-worker lease.

Revision ID: d6c571d7496a
Revises: 6a8bc39d29dc
Create Date: 2026-12-02 05:23:10.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "d6c571d7496a"
down_revision: str | None = "6a8bc39d29dc"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("turn", sa.Column("checked_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "maintenance_lease",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=255), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_maintenance_lease")),
    )


def downgrade() -> None:
    op.drop_table("maintenance_lease")
    with op.batch_alter_table("turn") as batch:
        batch.drop_column("checked_at")
