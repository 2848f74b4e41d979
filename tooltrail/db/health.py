"""The shared circuit breakers (pipeline spec §11): one ``tool_health`` row per tool name.

The rules live in ``tooltrail.core.breaker`` (pure functions of a ``BreakerState`` and a time);
this module keeps each tool's state in the database so every worker agrees on it. Each
operation reads the row together with the database server's clock (workers with skewed
clocks still agree), applies one pure function, and writes the row back only if it changed.
Exactly one probe is granted across workers because the write can only happen against the
state that was read:

- PostgreSQL: one transaction that locks the row (``SELECT ... FOR UPDATE``) before reading
  the clock, then ``UPDATE``. Concurrent callers queue on the row lock.
- SQLite: a compare-and-set. The row and clock are read without a transaction (WAL readers
  never block), then ``UPDATE ... WHERE`` every column still holds the value that was read;
  if another writer got there first, nothing matches and the operation runs again on the
  fresh row. Reading outside the write transaction matters: a SQLite transaction that read
  before another connection committed cannot be upgraded to a writer at all.

A new breaker's row is inserted with ``ON CONFLICT DO NOTHING``; the loser of a creation race
runs again on the winner's row. Either way an operation costs one read and at most one write
while nobody races it, and a Closed breaker's gate (the hot path) is a single read.

The statements are keyword-only functions that take the connection first (a Core
``AsyncConnection``: every statement here is Core, and ``HealthStore`` decides where each
transaction begins and ends); rows leave this module only as ``BreakerState`` models.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import DateTime, String, Table, func, literal_column, select, true, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from tooltrail.core.breaker import (
    BreakerState,
    BreakerStatus,
    CircuitBreaker,
    allow_request,
    initial_state,
    record_failure,
    record_success,
    would_allow_request,
)
from tooltrail.db.orm import ToolHealthRow
from tooltrail.db.store import AuditStore
from tooltrail.errors import TooltrailError

__all__ = [
    "BreakerContentionError",
    "HealthStore",
    "LoadedBreaker",
    "insert_breaker",
    "load_breaker",
    "update_breaker",
]

_T = TypeVar("_T")
_TABLE: Table = ToolHealthRow.__table__  # type: ignore[assignment]
_STATE_FIELDS = tuple(BreakerState.model_fields)
_MAX_ATTEMPTS = 1000
# SQLite's clock, in the format SQLAlchemy stores DateTime columns in (UTC, no zone).
_SQLITE_NOW = "%Y-%m-%d %H:%M:%f"


class BreakerContentionError(TooltrailError):
    """A breaker's row kept changing under a SQLite compare-and-set for 1000 attempts.

    Each attempt fails only because another writer succeeded, so this means the row is
    written by something that does not follow ``HealthStore``'s storage format.
    """


class LoadedBreaker(NamedTuple):
    """One tool's breaker as read, with the database server's clock at the read."""

    raw: Mapping[str, Any] | None
    """The row as read, column by column (for the compare-and-set); ``None``: no row."""
    state: BreakerState | None
    """The breaker, or ``None`` when the tool has none yet."""
    now: datetime
    """The database server's clock, read with the row (timezone-aware UTC)."""


def _utc(value: datetime | None) -> datetime | None:
    # SQLite returns naive datetimes; every time stored here is UTC.
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


async def load_breaker(conn: AsyncConnection, *, tool: str, lock: bool) -> LoadedBreaker:
    """Read ``tool``'s breaker and the database clock in one statement.

    Args:
        conn: the connection (inside the caller's transaction when ``lock``).
        tool: the tool name.
        lock: on PostgreSQL, lock the row (``FOR UPDATE``) until the transaction ends.
    """
    postgres = conn.dialect.name == "postgresql"
    row_query = select(_TABLE).where(_TABLE.c.tool_name == tool)
    if lock and postgres:
        row_query = row_query.with_for_update()
    row = row_query.subquery("h")
    # The clock is read in the outer query, which runs after the inner one has the row
    # lock: a caller that waited for the lock sees a time after the holder's.
    clock: ColumnElement[Any] = (
        func.clock_timestamp(type_=DateTime(timezone=True))
        if postgres
        else func.strftime(_SQLITE_NOW, "now", type_=String)
    )
    # A one-row relation left-joined to the row, so the clock comes back without a row.
    one = select(literal_column("1").label("one")).subquery("one")
    query = select(clock.label("db_now"), *row.c).select_from(one.outerjoin(row, true()))
    result = (await conn.execute(query)).mappings().one()
    now = result["db_now"]
    now = now.astimezone(UTC) if postgres else datetime.fromisoformat(now).replace(tzinfo=UTC)
    if result["tool_name"] is None:
        return LoadedBreaker(None, None, now)
    values = {name: result[name] for name in _STATE_FIELDS}
    values["last_failure_at"] = _utc(values["last_failure_at"])
    values["probe_started_at"] = _utc(values["probe_started_at"])
    raw = {column.name: result[column.name] for column in _TABLE.c}
    return LoadedBreaker(raw, BreakerState.model_validate(values), now)


async def insert_breaker(
    conn: AsyncConnection, *, tool: str, state: BreakerState, now: datetime
) -> bool:
    """Create ``tool``'s breaker row; ``False`` if another caller created it first."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = (
        dialect.insert(_TABLE)
        .values(tool_name=tool, updated_at=now, **state.model_dump())
        .on_conflict_do_nothing(index_elements=[_TABLE.c.tool_name])
        .returning(_TABLE.c.tool_name)
    )
    # Nothing returned: another caller created the breaker first; run again on its row.
    return (await conn.execute(stmt)).first() is not None


async def update_breaker(
    conn: AsyncConnection,
    *,
    tool: str,
    raw: Mapping[str, Any] | None,
    state: BreakerState,
    now: datetime,
) -> bool:
    """Write ``state`` over ``tool``'s row; ``False`` if the row changed since it was read.

    Args:
        conn: the connection, inside the transaction that read the row.
        tool: the tool name.
        raw: the row as read (``LoadedBreaker.raw``); on SQLite the update only applies
            while every column still holds these values (PostgreSQL holds the row lock).
        state: the breaker to store.
        now: the database clock read with the row.
    """
    stmt = update(_TABLE).where(_TABLE.c.tool_name == tool)
    if conn.dialect.name != "postgresql" and raw is not None:
        # Compare-and-set: only if nobody wrote the row since it was read.
        stmt = stmt.where(
            *(
                _TABLE.c[name].is_not_distinct_from(value)
                for name, value in raw.items()
                if name != "tool_name"
            )
        )
    result = await conn.execute(stmt.values(updated_at=now, **state.model_dump()))
    return result.rowcount == 1


class HealthStore:
    """The shared circuit breakers, one row of ``tool_health`` per tool name.

    Every operation is atomic against every other operation on the same tool, from any
    worker: across concurrent callers, an Open breaker grants exactly one probe.
    """

    def __init__(self, store: AuditStore) -> None:
        """Use the audit database of ``store`` (its engine; the store stays the owner)."""
        self._engine: AsyncEngine = store.engine

    async def allow_request(self, tool: str, config: CircuitBreaker) -> bool:
        """The gate (spec §11.2): whether a call of ``tool`` may run now.

        Creates the tool's breaker from ``config`` if it has none; may grant the probe.
        """
        return await self._apply(tool, config, allow_request)

    async def gate(self, tool: str, config: CircuitBreaker) -> tuple[bool, bool]:
        """``allow_request``, also saying whether the call was granted the half-open probe.

        The tool activity marks a granted probe at once in its heartbeat details, so a
        Temporal retry of the same attempt (a lost worker) is not refused by its own probe.

        Returns:
            ``(allowed, probe)``.
        """

        def step(state: BreakerState, now: datetime) -> tuple[BreakerState, tuple[bool, bool]]:
            new, allowed = allow_request(state, now)
            return new, (allowed, allowed and state.state != "closed")

        return await self._apply(tool, config, step)

    async def would_allow_request(self, tool: str, config: CircuitBreaker) -> bool:
        """Whether ``allow_request`` would allow a call now; changes nothing.

        ``config`` is accepted for symmetry with ``allow_request``: a tool without a breaker
        is Closed, whatever the configuration.
        """
        async with self._engine.connect() as conn:
            loaded = await load_breaker(conn, tool=tool, lock=False)
        if loaded.state is None:
            return would_allow_request(initial_state(config), loaded.now)
        return would_allow_request(loaded.state, loaded.now)

    is_tool_available = would_allow_request

    async def record(
        self, tool: str, *, is_error: bool, duration_ms: float, config: CircuitBreaker
    ) -> BreakerStatus:
        """Record an attempt's outcome: a failure if ``is_error``, else a success.

        Creates the tool's breaker from ``config`` if it has none.

        Returns:
            The breaker's state after the record (for telemetry).
        """
        step = record_failure if is_error else record_success

        def apply(state: BreakerState, now: datetime) -> tuple[BreakerState, BreakerStatus]:
            new = step(state, now, duration_ms)
            return new, new.state

        return await self._apply(tool, config, apply)

    async def snapshot(self, tool: str) -> BreakerState | None:
        """Return the tool's breaker as stored, or ``None`` if it has none yet."""
        async with self._engine.connect() as conn:
            return (await load_breaker(conn, tool=tool, lock=False)).state

    async def _apply(
        self,
        tool: str,
        config: CircuitBreaker,
        step: Callable[[BreakerState, datetime], tuple[BreakerState, _T]],
    ) -> _T:
        for _ in range(_MAX_ATTEMPTS):
            async with self._engine.begin() as conn:
                loaded = await load_breaker(conn, tool=tool, lock=True)
                old = loaded.state
                new, result = step(old or initial_state(config), loaded.now)
                if old is None:
                    written = await insert_breaker(conn, tool=tool, state=new, now=loaded.now)
                elif new == old:
                    written = True
                else:
                    written = await update_breaker(
                        conn, tool=tool, raw=loaded.raw, state=new, now=loaded.now
                    )
                if written:
                    return result
        raise BreakerContentionError(
            f"the breaker of tool {tool!r} changed under {_MAX_ATTEMPTS} compare-and-set "
            "attempts; is something else writing tool_health?"
        )
