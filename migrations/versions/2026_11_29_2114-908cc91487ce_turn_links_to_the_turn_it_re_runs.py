"""Turns link to the turn they re-run (rerun and shadow replays).

Revision ID: 908cc91487ce
Revises: cee2855389ba
Create Date: 2026-11-29 21:14:52.779968
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "908cc91487ce"
down_revision: str | None = "cee2855389ba"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("turn", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rerun_of", sa.String(length=255), nullable=True))
        batch_op.add_column(
            sa.Column("mode", sa.String(length=16), server_default="live", nullable=False)
        )
        batch_op.create_index(batch_op.f("ix_turn_rerun_of"), ["rerun_of"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("turn", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_turn_rerun_of"))
        batch_op.drop_column("mode")
        batch_op.drop_column("rerun_of")
