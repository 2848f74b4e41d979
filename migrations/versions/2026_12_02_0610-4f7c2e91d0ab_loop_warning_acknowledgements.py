"""Loop-warning acknowledgements of a session, apart from its state.

Revision ID: 4f7c2e91d0ab
Revises: 5c9ef3414ea9
Create Date: 2026-12-02 05:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "4f7c2e91d0ab"
down_revision: str | None = "5c9ef3414ea9"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "session_state",
        sa.Column(
            "acknowledged",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
    )


def downgrade() -> None:
    op.drop_column("session_state", "acknowledged")
