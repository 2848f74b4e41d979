"""Run-aware audit records: each record names its Temporal run; turns know their runs.

A reset or any new run of a turn's workflow id writes its own branch of the trail, so the
records are unique per (turn, run, seq) instead of (turn, seq). Rows written before this
revision keep an empty run id (their own branch). Attempt records also name Temporal's
activity attempt and the worker that ran it, and every record its run's hash chain digest.

Revision ID: f796bcc3b7d8
Revises: 4f7c2e91d0ab
Create Date: 2026-12-02 05:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f796bcc3b7d8"
down_revision: str | None = "4f7c2e91d0ab"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("audit_event", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("run_id", sa.String(length=255), server_default="", nullable=False)
        )
        batch_op.add_column(sa.Column("temporal_attempt", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("worker", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("digest", sa.String(length=64), nullable=True))
        batch_op.drop_constraint(batch_op.f("uq_audit_event_turn_id_seq"), type_="unique")
        batch_op.create_unique_constraint(
            batch_op.f("uq_audit_event_turn_id_run_id_seq"), ["turn_id", "run_id", "seq"]
        )
    with op.batch_alter_table("turn", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("run_id", sa.String(length=255), server_default="", nullable=False)
        )
    op.create_table(
        "turn_run",
        sa.Column("turn_id", sa.String(length=255), nullable=False),
        sa.Column("run_id", sa.String(length=255), nullable=False),
        sa.Column("branched_from", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["turn_id"],
            ["turn.turn_id"],
            name=op.f("fk_turn_run_turn_id_turn"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("turn_id", "run_id", name=op.f("pk_turn_run")),
    )


def downgrade() -> None:
    op.drop_table("turn_run")
    with op.batch_alter_table("turn", schema=None) as batch_op:
        batch_op.drop_column("run_id")
    # Records of later runs would collide on (turn, seq): keep the first run's only.
    op.execute(
        "DELETE FROM audit_event WHERE id NOT IN "
        "(SELECT MIN(id) FROM audit_event GROUP BY turn_id, seq)"
    )
    with op.batch_alter_table("audit_event", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_audit_event_turn_id_run_id_seq"), type_="unique")
        batch_op.create_unique_constraint(
            batch_op.f("uq_audit_event_turn_id_seq"), ["turn_id", "seq"]
        )
        batch_op.drop_column("digest")
        batch_op.drop_column("worker")
        batch_op.drop_column("temporal_attempt")
        batch_op.drop_column("run_id")
