"""Blobs: large tool outputs kept out of workflow history (claim check).

Revision ID: 6a8bc39d29dc
Revises: 1a44d30b5093
Create Date: 2026-11-29 21:29:31.591313
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "6a8bc39d29dc"
down_revision: str | None = "1a44d30b5093"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "blob",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column(
            "content",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_blob")),
    )


def downgrade() -> None:
    op.drop_table("blob")
