"""The SQL of reconciliation: running turns to check, closing them, the one-worker lease.

Reconciliation (``tooltrail.runtime.reconciler``) asks Temporal how the turns that SQL still calls
``running`` really ended; this module reads and writes the rows it needs. A turn is closed
at most once: only a ``running`` row moves, in the same transaction as its
``turn_reconciled`` event, so a turn's own final write and a reconciliation never both win.

It also keeps how far reconciliation has looked for turns that closed with no row at all
(``rebuild_watermark``) and writes the trails it rebuilds from their histories, through the
same writes as a turn's own records (so their hash chain is computed alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from tooltrail.core.wire import AuditEvent, TurnRecord

# The database's clock, the way idempotency claims read it (one definition of it).
from tooltrail.db.idempotency import _db_now
from tooltrail.db.orm import AuditEventRow, MaintenanceLeaseRow, RebuildWatermarkRow, TurnRow
from tooltrail.db.store import _aware, record_events, record_turn

__all__ = [
    "EPOCH",
    "RebuildWatermark",
    "close_turn",
    "earliest_turn_start",
    "load_watermark",
    "mark_checked",
    "record_rebuilt_turn",
    "release_lease",
    "running_turns",
    "save_watermark",
    "take_lease",
    "turns_with_rows",
]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""An expiry in the past: a released lease."""


async def running_turns(
    session: AsyncSession,
    *,
    since: datetime | None = None,
    started_before: datetime | None = None,
    checked_before: datetime | None = None,
    limit: int | None = None,
) -> list[str]:
    """Return the ids of turns whose row says ``running``, least recently checked first.

    Args:
        session: the database session.
        since: only turns started at or after this time.
        started_before: only turns started before this time (the grace period).
        checked_before: only turns never checked, or last checked before this time.
        limit: at most this many.
    """
    query = select(TurnRow.turn_id).where(TurnRow.status == "running")
    if since is not None:
        query = query.where(TurnRow.started_at >= since)
    if started_before is not None:
        query = query.where(TurnRow.started_at < started_before)
    if checked_before is not None:
        query = query.where(TurnRow.checked_at.is_(None) | (TurnRow.checked_at < checked_before))
    # Never-checked turns first (by age), then the longest unchecked: a long-running turn
    # cannot starve the others of a batch.
    query = query.order_by(func.coalesce(TurnRow.checked_at, TurnRow.started_at), TurnRow.turn_id)
    if limit is not None:
        query = query.limit(limit)
    return list(await session.scalars(query))


async def mark_checked(session: AsyncSession, *, turn_ids: Sequence[str], at: datetime) -> None:
    """Note that Temporal was asked about these turns at ``at``."""
    if turn_ids:
        await session.execute(
            update(TurnRow).where(TurnRow.turn_id.in_(list(turn_ids))).values(checked_at=at)
        )


async def close_turn(
    session: AsyncSession,
    *,
    turn_id: str,
    status: str,
    ended_at: datetime | None,
    error: str | None,
    error_type: str | None,
    payload: dict[str, Any],
    at: datetime,
) -> bool:
    """Move a ``running`` turn to ``status`` and append its ``turn_reconciled`` event.

    The event goes after the turn's last ``seq`` of the run ``payload["run_id"]`` names, or,
    when Temporal named none (a turn it does not know), of the run the row names. Returns
    whether the row moved (False when it was no longer ``running``: its own final write came
    first, and nothing is written).
    """
    moved = await session.execute(
        update(TurnRow)
        .where(TurnRow.turn_id == turn_id, TurnRow.status == "running")
        .values(
            status=status,
            ended_at=ended_at or at,
            error=error,
            error_type=error_type,
            checked_at=at,
        )
    )
    if getattr(moved, "rowcount", 0) != 1:
        return False
    # The event belongs to the run Temporal closed (its records' branch, hash chain included);
    # of a turn Temporal does not know, to the run that wrote its row.
    run_id = str(payload.get("run_id") or "")
    if not run_id:
        row_run = select(TurnRow.run_id).where(TurnRow.turn_id == turn_id)
        run_id = await session.scalar(row_run) or ""
    last = await session.scalar(
        select(func.max(AuditEventRow.seq)).where(
            AuditEventRow.turn_id == turn_id, AuditEventRow.run_id == run_id
        )
    )
    event = AuditEvent(
        seq=0 if last is None else last + 1,
        kind="turn_reconciled",
        payload=payload,
        created_at=at,
        run_id=run_id or None,
    )
    await record_events(session, turn_id=turn_id, events=[event], run_id=run_id)
    return True


async def take_lease(session: AsyncSession, *, name: str, holder: str, seconds: float) -> bool:
    """Take or renew the lease ``name`` for ``holder`` for ``seconds``.

    One statement that works alike on SQLite and PostgreSQL: insert the lease, or take it
    over when it is ours or has expired; then read who holds it. Times are the database's
    clock, as for idempotency claims, so workers with skewed clocks agree. Returns whether
    ``holder`` holds it.
    """
    table: Any = MaintenanceLeaseRow.__table__
    upsert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    stmt = upsert(table).values(name=name, holder=holder, expires_at=_db_now(session, seconds))
    stmt = stmt.on_conflict_do_update(
        index_elements=["name"],
        set_={"holder": stmt.excluded.holder, "expires_at": stmt.excluded.expires_at},
        where=(table.c.expires_at < _db_now(session)) | (table.c.holder == stmt.excluded.holder),
    )
    await session.execute(stmt)
    current = await session.scalar(select(table.c.holder).where(table.c.name == name))
    return bool(current == holder)


async def release_lease(session: AsyncSession, *, name: str, holder: str) -> None:
    """Let go of the lease ``name`` if ``holder`` has it, so another worker takes it at once."""
    table: Any = MaintenanceLeaseRow.__table__
    await session.execute(
        update(table).where(table.c.name == name, table.c.holder == holder).values(expires_at=EPOCH)
    )


class RebuildWatermark(BaseModel):
    """How far the search for closed turns without a row got (a ``rebuild_watermark`` row)."""

    closed_since: datetime | None = None
    """Every turn that closed before this time was looked at (``None``: none yet)."""
    window_end: datetime | None = None
    """The end of the window under way (``None``: the next pass opens one)."""
    resume_before: datetime | None = None
    """Within the window, the turns that closed at or after this time were looked at."""


async def load_watermark(
    session: AsyncSession, *, namespace: str, task_queue: str
) -> RebuildWatermark:
    """Return the watermark of a namespace's task queue (a fresh one when none is stored)."""
    row = await session.get(RebuildWatermarkRow, (namespace, task_queue))
    if row is None:
        return RebuildWatermark()
    return RebuildWatermark(
        closed_since=_aware(row.closed_since),
        window_end=_aware(row.window_end),
        resume_before=_aware(row.resume_before),
    )


async def save_watermark(
    session: AsyncSession, *, namespace: str, task_queue: str, mark: RebuildWatermark
) -> None:
    """Store the watermark of a namespace's task queue (insert or replace)."""
    table: Any = RebuildWatermarkRow.__table__
    upsert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    values = {**mark.model_dump(), "updated_at": datetime.now(UTC)}
    stmt = upsert(table).values(namespace=namespace, task_queue=task_queue, **values)
    stmt = stmt.on_conflict_do_update(
        index_elements=["namespace", "task_queue"],
        set_={column: stmt.excluded[column] for column in values},
    )
    await session.execute(stmt)


async def earliest_turn_start(session: AsyncSession) -> datetime | None:
    """When the database's first turn started (``None``: it has none)."""
    first = await session.scalar(select(func.min(TurnRow.started_at)))
    return _aware(first) if first is not None else None


async def turns_with_rows(session: AsyncSession, *, turn_ids: Sequence[str]) -> set[str]:
    """Return those of ``turn_ids`` that have a ``turn`` row."""
    if not turn_ids:
        return set()
    found = await session.scalars(
        select(TurnRow.turn_id).where(TurnRow.turn_id.in_(list(set(turn_ids))))
    )
    return set(found)


async def record_rebuilt_turn(
    session: AsyncSession, *, turn: TurnRecord, events: Sequence[AuditEvent]
) -> bool:
    """Write a turn rebuilt from its history: its row and its records (run ``turn.run_id``).

    Only for a turn with no row: when one appeared meanwhile (the turn's own write landed
    late, another reconciler was quicker), nothing is written and False is returned. The
    records go through ``record_events``, so their hash chain is computed as for any other.
    """
    if await session.get(TurnRow, turn.turn_id) is not None:
        return False
    await record_turn(session, turn=turn, run_id=turn.run_id)
    await record_events(session, turn_id=turn.turn_id, events=events, run_id=turn.run_id)
    return True
