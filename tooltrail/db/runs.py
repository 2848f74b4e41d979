"""Agent runs in SQL: a run's turns, its conversation's turn boundaries, and fork links.

A run has no row of its own. Its turns are the turns whose ``model_response`` event names
it (the event carries the run id whatever the turn ids look like), its conversation is
``conversation_message`` rows, and a fork is a ``run_fork`` row read from both ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel
from sqlalchemy import delete, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from tooltrail.core.messages import Message
from tooltrail.core.wire import TurnRecord
from tooltrail.db.orm import AuditEventRow, ConversationMessageRow, RunForkRow, TurnRow
from tooltrail.db.store import _aware, _insert

__all__ = [
    "ConversationRow",
    "RunLink",
    "copy_conversation",
    "forget_fork",
    "list_run_links",
    "list_run_turns",
    "load_run_rows",
    "record_fork",
]


class RunLink(BaseModel):
    """A fork, as one of its two runs sees it."""

    direction: Literal["forked_from", "forked_to"]
    """``forked_from``: this run was forked from ``other_run_id``; ``forked_to``: the other
    run was forked from this one."""
    other_run_id: str
    from_turn: int
    """The original run's turn (0-based) the forked run starts again from."""
    message_replaced: bool
    created_at: datetime

    def describe(self) -> str:
        """The link in one line: ``forked to X at turn K`` / ``forked from Y at turn K``."""
        where = "to" if self.direction == "forked_to" else "from"
        text = f"forked {where} {self.other_run_id} at turn {self.from_turn}"
        return text + (" (last user message replaced)" if self.message_replaced else "")


class ConversationRow(BaseModel):
    """One stored message of a run's conversation, with what only the row knows."""

    seq: int
    message: Message
    usage: dict[str, Any] | None = None
    """Set on the model's answers (token usage and stop reason): it marks a turn's answer."""
    created_at: datetime


async def list_run_turns(session: AsyncSession, *, run_id: str) -> list[TurnRecord]:
    """Return the turns of an agent run that asked its model, in the order they started."""
    named = (
        select(AuditEventRow.turn_id)
        .where(
            AuditEventRow.kind == "model_response",
            AuditEventRow.payload["run_id"].as_string() == run_id,
        )
        .distinct()
    )
    rows = await session.scalars(
        select(TurnRow)
        .where(TurnRow.turn_id.in_(named))
        .order_by(TurnRow.started_at, TurnRow.turn_id)
    )
    turns = []
    for row in rows:
        record = TurnRecord.model_validate(row, from_attributes=True)
        record.started_at = _aware(record.started_at) or record.started_at
        record.ended_at = _aware(record.ended_at)
        turns.append(record)
    return turns


async def load_run_rows(session: AsyncSession, *, run_id: str) -> list[ConversationRow]:
    """Return a run's conversation rows in order (answers carry their ``usage``)."""
    table = ConversationMessageRow.__table__
    rows = await session.execute(
        select(table.c.seq, table.c.message, table.c.usage, table.c.created_at)
        .where(table.c.run_id == run_id)
        .order_by(table.c.seq)
    )
    return [
        ConversationRow(
            seq=row.seq,
            message=Message.model_validate(row.message),
            usage=row.usage,
            created_at=_aware(row.created_at) or row.created_at,
        )
        for row in rows
    ]


async def copy_conversation(
    session: AsyncSession, *, run_id: str, rows: Sequence[ConversationRow]
) -> None:
    """Store ``rows`` as the start of ``run_id``'s conversation, renumbered from 0.

    Answers keep their usage, so the copy reads as the original did; positions already
    stored are left alone (a retried fork writes nothing twice).
    """
    if not rows:
        return
    values = [
        {
            "run_id": run_id,
            "seq": position,
            "role": row.message.role,
            "message": row.message.model_dump(mode="json"),
            "usage": row.usage,
            "created_at": row.created_at,
        }
        for position, row in enumerate(rows)
    ]
    insert = _insert(session, ConversationMessageRow.__table__)
    await session.execute(insert.on_conflict_do_nothing(index_elements=["run_id", "seq"]), values)


async def record_fork(
    session: AsyncSession,
    *,
    run_id: str,
    source_run_id: str,
    from_turn: int,
    message_replaced: bool,
    created_at: datetime,
) -> None:
    """Link ``run_id`` to the run it was forked from (once)."""
    insert = _insert(session, RunForkRow.__table__)
    await session.execute(
        insert.on_conflict_do_nothing(index_elements=["run_id"]),
        {
            "run_id": run_id,
            "source_run_id": source_run_id,
            "from_turn": from_turn,
            "message_replaced": message_replaced,
            "created_at": created_at,
        },
    )


async def forget_fork(session: AsyncSession, *, run_id: str) -> None:
    """Remove a fork that never started: its link and its copied conversation."""
    await session.execute(delete(RunForkRow).where(RunForkRow.run_id == run_id))
    await session.execute(
        delete(ConversationMessageRow).where(ConversationMessageRow.run_id == run_id)
    )


async def list_run_links(session: AsyncSession, *, run_id: str) -> list[RunLink]:
    """Return the forks of and from a run, oldest first."""
    rows = await session.scalars(
        select(RunForkRow)
        .where(or_(RunForkRow.run_id == run_id, RunForkRow.source_run_id == run_id))
        .order_by(RunForkRow.created_at, RunForkRow.run_id)
    )
    return [
        RunLink(
            direction="forked_from" if row.run_id == run_id else "forked_to",
            other_run_id=row.source_run_id if row.run_id == run_id else row.run_id,
            from_turn=row.from_turn,
            message_replaced=row.message_replaced,
            created_at=_aware(row.created_at) or row.created_at,
        )
        for row in rows
    ]
