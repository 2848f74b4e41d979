"""Audit trail, memory and turns: the first schema.

Revision ID: b932c1cc1774
Revises:
Create Date: 2026-11-29 20:34:58.911657
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "b932c1cc1774"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "memory_entry",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("turn_id", sa.String(length=255), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("tool_call_id", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_memory_entry")),
        sa.UniqueConstraint("turn_id", "seq", name=op.f("uq_memory_entry_turn_id_seq")),
    )
    with op.batch_alter_table("memory_entry", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_memory_entry_session_id"), ["session_id"], unique=False
        )

    op.create_table(
        "turn",
        sa.Column("turn_id", sa.String(length=255), nullable=False),
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("call_count", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_type", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("turn_id", name=op.f("pk_turn")),
    )
    with op.batch_alter_table("turn", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_turn_session_id"), ["session_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_turn_started_at"), ["started_at"], unique=False)

    op.create_table(
        "audit_event",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("turn_id", sa.String(length=255), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("tool_call_id", sa.String(length=255), nullable=True),
        sa.Column("tool_name", sa.String(length=255), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column(
            "payload",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["turn_id"],
            ["turn.turn_id"],
            name=op.f("fk_audit_event_turn_id_turn"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_event")),
        sa.UniqueConstraint("turn_id", "seq", name=op.f("uq_audit_event_turn_id_seq")),
    )
    with op.batch_alter_table("audit_event", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_event_tool_name"), ["tool_name"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("audit_event", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_event_tool_name"))

    op.drop_table("audit_event")
    with op.batch_alter_table("turn", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_turn_started_at"))
        batch_op.drop_index(batch_op.f("ix_turn_session_id"))

    op.drop_table("turn")
    with op.batch_alter_table("memory_entry", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_memory_entry_session_id"))

    op.drop_table("memory_entry")
