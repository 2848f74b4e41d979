"""The registry directory's rows carry their worker's MAC; each worker's approver set.

Revision ID: b4e8f2a6c9d1
Revises: a7c3d9e2f104
Create Date: 2026-12-05 17:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b4e8f2a6c9d1"
down_revision: str | None = "a7c3d9e2f104"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Rows published before the MAC have none: peers ignore them until their worker (now
    # upgraded) publishes again, within 30 s.
    with op.batch_alter_table("tool_registry") as batch:
        batch.add_column(sa.Column("mac", sa.String(length=100), server_default="", nullable=False))
    op.create_table(
        "worker_approvers",
        sa.Column("task_queue", sa.String(length=255), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=False),
        sa.Column("approvers", sa.String(length=64), nullable=False),
        sa.Column("mac", sa.String(length=100), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("task_queue", "worker", name=op.f("pk_worker_approvers")),
    )


def downgrade() -> None:
    op.drop_table("worker_approvers")
    with op.batch_alter_table("tool_registry") as batch:
        batch.drop_column("mac")
