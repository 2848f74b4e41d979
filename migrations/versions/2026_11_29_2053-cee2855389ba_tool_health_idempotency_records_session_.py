"""Tool health (circuit breakers), idempotency records and session state.

Revision ID: cee2855389ba
Revises: b932c1cc1774
Create Date: 2026-11-29 20:53:32.395646
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "cee2855389ba"
down_revision: str | None = "b932c1cc1774"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "idempotency_record",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("tool_name", sa.String(length=255), nullable=False),
        sa.Column("scope_principal", sa.String(length=255), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "outcome",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("source_call_id", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('pending', 'succeeded', 'failed')", name=op.f("ck_idempotency_record_state")
        ),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_idempotency_record")),
    )
    with op.batch_alter_table("idempotency_record", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_idempotency_record_expires_at"), ["expires_at"], unique=False
        )

    op.create_table(
        "session_state",
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column(
            "state",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("last_turn_id", sa.String(length=255), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_session_state")),
    )
    op.create_table(
        "tool_health",
        sa.Column("tool_name", sa.String(length=255), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False),
        sa.Column("last_failure_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("probe_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("failure_threshold", sa.Integer(), nullable=False),
        sa.Column("recovery_ms", sa.BigInteger(), nullable=False),
        sa.Column("probe_timeout_ms", sa.BigInteger(), nullable=False),
        sa.Column("successes", sa.BigInteger(), nullable=False),
        sa.Column("failures", sa.BigInteger(), nullable=False),
        sa.Column("ewma_micros", sa.BigInteger(), nullable=False),
        sa.Column("last_duration_ms", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "state IN ('closed', 'open', 'half_open')", name=op.f("ck_tool_health_state")
        ),
        sa.PrimaryKeyConstraint("tool_name", name=op.f("pk_tool_health")),
    )


def downgrade() -> None:
    op.drop_table("tool_health")
    op.drop_table("session_state")
    with op.batch_alter_table("idempotency_record", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_idempotency_record_expires_at"))

    op.drop_table("idempotency_record")
