"""The registries of the workers of each task queue (tools kept apart by fingerprint).

Revision ID: 3e8a51c7d2f6
Revises: 3c8e1f0a7b52
Create Date: 2026-12-02 14:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "3e8a51c7d2f6"
down_revision: str | None = "3c8e1f0a7b52"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tool_registry",
        sa.Column("task_queue", sa.String(length=255), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column(
            "tools",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        # The tools' catalog entries (what a model is offered), as JSON text: kept byte for
        # byte, so a peer offers a model exactly the entry the tool's own worker would.
        sa.Column("catalog", sa.Text(), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("task_queue", "fingerprint", name=op.f("pk_tool_registry")),
    )


def downgrade() -> None:
    op.drop_table("tool_registry")
