"""The SQL of reconciliation: running turns to check, closing them, the one-worker lease.

Reconciliation (``tooltrail.runtime.reconciler``) asks Temporal how the turns that SQL still calls
``running`` really ended; this module reads and writes the rows it needs. A turn is closed
at most once: only a ``running`` row moves, in the same transaction as its
``turn_reconciled`` event, so a turn's own final write and a reconciliation never both win.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from tooltrail.core.wire import AuditEvent

# The database's clock, the way idempotency claims read it (one definition of it).
from tooltrail.db.idempotency import _db_now
from tooltrail.db.orm import AuditEventRow, MaintenanceLeaseRow, TurnRow
from tooltrail.db.store import record_events

__all__ = [
    "EPOCH",
    "close_turn",
    "mark_checked",
    "release_lease",
    "running_turns",
    "take_lease",
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

    The event goes after the turn's last ``seq``. Returns whether the row moved (False when
    it was no longer ``running``: its own final write came first, and nothing is written).
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
    # The event belongs to the run Temporal closed (its records' branch, hash chain included).
    run_id = str(payload.get("run_id") or "")
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
