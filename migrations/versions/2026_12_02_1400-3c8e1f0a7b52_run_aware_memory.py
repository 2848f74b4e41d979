"""Run-aware memory notes: each note names its Temporal run, unique per (turn, run, seq).

A reset turn's new run numbers its records from 0 again, so its memory notes collided with
the earlier run's on (turn, seq) and were dropped. Like ``audit_event`` (f796bcc3b7d8), the
notes are now unique per (turn, run, seq).

Existing notes get the run that wrote them where the trail can tell: before this revision
a note (turn, seq) was kept from the first run that wrote one, so it is the earliest run of
the turn (``turn_run``, by first write) whose trail has a ``tool_post`` at that ``seq``. Notes
of turns recorded before run ids (no ``turn_run`` row; their records' run id is empty) keep
an empty run id, the same branch as their records.

Revision ID: 3c8e1f0a7b52
Revises: 9d3b7e5a1c24
Create Date: 2026-12-02 14:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "3c8e1f0a7b52"
down_revision: str | None = "9d3b7e5a1c24"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# One statement on both databases (a correlated subquery; no UPDATE ... FROM on SQLite's
# older versions). The subquery reads turn_run by its key and audit_event by its unique
# (turn_id, run_id, seq) index.
_BACKFILL = """
UPDATE memory_entry SET run_id = COALESCE((
    SELECT tr.run_id FROM turn_run tr
    JOIN audit_event ae ON ae.turn_id = tr.turn_id AND ae.run_id = tr.run_id
    WHERE tr.turn_id = memory_entry.turn_id
      AND ae.seq = memory_entry.seq
      AND ae.kind = 'tool_post'
    ORDER BY tr.created_at, tr.run_id
    LIMIT 1
), '')
"""


def upgrade() -> None:
    with op.batch_alter_table("memory_entry", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("run_id", sa.String(length=255), server_default="", nullable=False)
        )
    op.execute(_BACKFILL)
    with op.batch_alter_table("memory_entry", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_memory_entry_turn_id_seq"), type_="unique")
        batch_op.create_unique_constraint(
            batch_op.f("uq_memory_entry_turn_id_run_id_seq"), ["turn_id", "run_id", "seq"]
        )


def downgrade() -> None:
    # Notes of later runs would collide on (turn, seq): keep the first one of each.
    op.execute(
        "DELETE FROM memory_entry WHERE id NOT IN "
        "(SELECT MIN(id) FROM memory_entry GROUP BY turn_id, seq)"
    )
    with op.batch_alter_table("memory_entry", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_memory_entry_turn_id_run_id_seq"), type_="unique")
        batch_op.create_unique_constraint(
            batch_op.f("uq_memory_entry_turn_id_seq"), ["turn_id", "seq"]
        )
        batch_op.drop_column("run_id")
