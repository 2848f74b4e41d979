"""The idempotency store in SQL: claims and outcomes in ``idempotency_record`` (spec §5.4).

The policy, the keys, the store's contract and the resolution loop live in
``tooltrail.tools.idempotency`` (no SQL); this module implements that contract on the audit
database. Every time comparison uses the database's clock, so workers with skewed clocks still
agree on who holds a lease and when an outcome expires. No transaction is held while a body
runs: each operation is one short transaction (``claim`` at most two).

The statements are keyword-only functions that take the session first; rows leave this module
only as the contract's models (``StoredOutcome``, ``IdempotencyRecord``, ``Claim``).
``SqlIdempotencyStore`` opens the transactions and reports database failures as
``IdempotencyStoreUnavailable``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    DateTime,
    Table,
    and_,
    case,
    delete,
    func,
    literal_column,
    null,
    or_,
    select,
    type_coerce,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.ext.asyncio import AsyncSession

from tooltrail.db.orm import IdempotencyRecordRow
from tooltrail.db.store import AuditStore, _aware, _insert
from tooltrail.tools.idempotency import (
    Acquired,
    Busy,
    Claim,
    Completed,
    CompleteHook,
    IdempotencyRecord,
    IdempotencyStoreUnavailable,
    StoredOutcome,
    outcome_state,
    put_owner,
)

__all__ = [
    "SqlIdempotencyStore",
    "complete_claim",
    "get_outcome",
    "get_record",
    "purge_expired",
    "put_outcome",
    "read_claim",
    "release_claim",
    "renew_claim",
    "try_claim",
]

_TABLE = cast(Table, IdempotencyRecordRow.__table__)
_C = _TABLE.c
# SQLAlchemy stores DATETIME on SQLite as text with six fractional digits; SQLite's own clock
# gives three, so pad it: the text of both compares in time order.
_SQLITE_NOW_FORMAT = "%Y-%m-%d %H:%M:%f"
_DB_ERRORS = (DBAPIError, PoolTimeoutError, OSError, TimeoutError)


def _db_now(session: AsyncSession, plus_seconds: float = 0.0) -> ColumnElement[datetime]:
    """The database's current time, plus a number of seconds, as a SQL expression."""
    if not math.isfinite(plus_seconds):
        raise ValueError(f"not a finite number of seconds: {plus_seconds!r}")
    offset = f"{plus_seconds:.6f}"
    if session.get_bind().dialect.name == "postgresql":
        # statement_timestamp(): the server's clock at the start of this statement, not
        # the start of the transaction as now() would be.
        sql = "statement_timestamp()"
        if plus_seconds:
            sql = f"(statement_timestamp() + interval '{offset} seconds')"
        return literal_column(sql, DateTime(timezone=True))
    # SQLite's 'now' is fixed for the duration of one statement.
    expr = func.strftime(_SQLITE_NOW_FORMAT, "now", f"{offset} seconds").concat("000")
    return type_coerce(expr, DateTime(timezone=True))


def _owned(key: str, owner: str) -> ColumnElement[bool]:
    return and_(_C.key == key, _C.owner == owner, _C.state == "pending")


async def try_claim(
    session: AsyncSession,
    *,
    key: str,
    tool_name: str,
    owner: str,
    lease_seconds: float,
    scope_principal: str | None = None,
) -> bool:
    """Make ``owner`` the holder of ``key``'s claim if nobody else may hold it.

    Inserts a pending row (``ON CONFLICT DO NOTHING``), else takes over a pending row whose
    lease lapsed or a completed row that expired.

    Returns:
        Whether ``owner`` now holds the claim.
    """
    fresh = {
        "tool_name": tool_name,
        "scope_principal": scope_principal,
        "state": "pending",
        "owner": owner,
        "lease_expires_at": _db_now(session, lease_seconds),
        "outcome": null(),
        "source_call_id": None,
        "created_at": _db_now(session),
        "completed_at": None,
        "expires_at": None,
    }
    inserted = await session.execute(
        _insert(session, _TABLE)
        .values(key=key, **fresh)
        .on_conflict_do_nothing(index_elements=["key"])
        .returning(_C.key)
    )
    if inserted.first() is not None:
        return True
    now = _db_now(session)
    taken = await session.execute(
        update(_TABLE)
        .where(
            _C.key == key,
            or_(
                and_(_C.state == "pending", _C.lease_expires_at < now),
                and_(_C.state != "pending", _C.expires_at <= now),
            ),
        )
        .values(**fresh)
        .returning(_C.key)
    )
    return taken.first() is not None


async def read_claim(session: AsyncSession, *, key: str) -> Completed | Busy | None:
    """Read what holds ``key``: its live outcome (``Completed``) or a pending claim (``Busy``).

    Returns:
        ``None`` when there is neither (the row vanished or expired since it was claimed).
    """
    row = (
        await session.execute(
            select(
                _C.state,
                _C.outcome,
                _C.lease_expires_at,
                case((_C.expires_at > _db_now(session), True), else_=False).label("live"),
            ).where(_C.key == key)
        )
    ).first()
    if row is None:
        return None
    if row.state == "pending":
        return Busy(_aware(row.lease_expires_at))
    if row.live and row.outcome is not None:
        return Completed(StoredOutcome.model_validate(row.outcome))
    return None


async def renew_claim(session: AsyncSession, *, key: str, owner: str, lease_seconds: float) -> bool:
    """Extend ``owner``'s pending claim; ``False`` if it is no longer theirs."""
    result = await session.execute(
        update(_TABLE)
        .where(_owned(key, owner))
        .values(lease_expires_at=_db_now(session, lease_seconds))
        .returning(_C.key)
    )
    return result.first() is not None


async def complete_claim(
    session: AsyncSession, *, key: str, owner: str, outcome: StoredOutcome, ttl_seconds: int
) -> bool:
    """Store ``outcome`` if ``owner`` still holds the pending claim; ``False`` if not."""
    result = await session.execute(
        update(_TABLE)
        .where(_owned(key, owner))
        .values(
            state=outcome_state(outcome),
            outcome=outcome.model_dump(mode="json"),
            source_call_id=outcome.source_call_id,
            lease_expires_at=None,
            completed_at=_db_now(session),
            expires_at=_db_now(session, ttl_seconds),
        )
        .returning(_C.key)
    )
    return result.first() is not None


async def release_claim(session: AsyncSession, *, key: str, owner: str) -> None:
    """Drop ``owner``'s pending claim (no-op if it is not theirs)."""
    await session.execute(delete(_TABLE).where(_owned(key, owner)))


async def get_outcome(session: AsyncSession, *, key: str) -> StoredOutcome | None:
    """Return the unexpired outcome of ``key``, or ``None``."""
    outcome = (
        await session.execute(
            select(_C.outcome).where(
                _C.key == key, _C.state != "pending", _C.expires_at > _db_now(session)
            )
        )
    ).scalar_one_or_none()
    return None if outcome is None else StoredOutcome.model_validate(outcome)


async def put_outcome(
    session: AsyncSession, *, key: str, outcome: StoredOutcome, ttl_seconds: int, tool_name: str
) -> None:
    """Store an outcome for ``key`` directly, replacing any row (``tool_name`` kept if ``""``)."""
    values: dict[str, Any] = {
        "state": outcome_state(outcome),
        "owner": put_owner(outcome),
        "lease_expires_at": None,
        "outcome": outcome.model_dump(mode="json"),
        "source_call_id": outcome.source_call_id,
        "created_at": _db_now(session),
        "completed_at": _db_now(session),
        "expires_at": _db_now(session, ttl_seconds),
    }
    replace = dict(values)
    if tool_name:
        replace["tool_name"] = tool_name
    await session.execute(
        _insert(session, _TABLE)
        .values(key=key, tool_name=tool_name, scope_principal=None, **values)
        .on_conflict_do_update(index_elements=["key"], set_=replace)
    )


async def get_record(session: AsyncSession, *, key: str) -> IdempotencyRecord | None:
    """Return a copy of the row stored under ``key`` (expired or not), or ``None``."""
    row = await session.get(IdempotencyRecordRow, key)
    if row is None:
        return None
    return IdempotencyRecord(
        key=row.key,
        tool_name=row.tool_name,
        scope_principal=row.scope_principal,
        state=row.state,  # the CHECK constraint holds it to the Literal
        owner=row.owner,
        lease_expires_at=_aware(row.lease_expires_at),
        outcome=None if row.outcome is None else StoredOutcome.model_validate(row.outcome),
        source_call_id=row.source_call_id,
        created_at=_aware(row.created_at) or row.created_at,
        completed_at=_aware(row.completed_at),
        expires_at=_aware(row.expires_at),
    )


async def purge_expired(session: AsyncSession) -> int:
    """Delete expired outcomes; return how many."""
    result = await session.execute(
        delete(_TABLE)
        .where(_C.state != "pending", _C.expires_at <= _db_now(session))
        .returning(_C.key)
    )
    return len(result.all())


class SqlIdempotencyStore:
    """The idempotency store in the audit database's ``idempotency_record`` table (§5.4).

    Every time comparison uses the database's clock; every method is one short transaction
    (``claim`` at most two). Database failures raise ``IdempotencyStoreUnavailable``.
    """

    def __init__(self, store: AuditStore) -> None:
        """Use the audit database of ``store`` (its engine and session factory)."""
        self._store = store

    @contextlib.asynccontextmanager
    async def _transaction(self, what: str) -> AsyncIterator[AsyncSession]:
        try:
            async with self._store.sessions.begin() as session:
                yield session
        except _DB_ERRORS as exc:
            raise IdempotencyStoreUnavailable(
                f"idempotency store unavailable ({what}): {type(exc).__name__}: {exc}"
            ) from exc

    async def claim(
        self,
        key: str,
        *,
        tool_name: str,
        owner: str,
        lease_seconds: float,
        scope_principal: str | None = None,
    ) -> Claim:
        """Claim ``key`` for ``owner``; see ``IdempotencyStore.claim``.

        1. insert a pending row (``ON CONFLICT DO NOTHING``): a new row means ``Acquired``;
        2. take over a pending row whose lease lapsed, or a completed row that expired:
           ``Acquired``;
        3. read the row: an unexpired outcome means ``Completed``, a pending claim ``Busy``.

        Raises:
            IdempotencyStoreUnavailable: the database failed.
        """
        # A row can vanish between the steps (released, or purged): then start over. After a
        # few rounds of that, report Busy and let the caller poll.
        for _ in range(3):
            async with self._transaction("claim") as session:
                claimed = await try_claim(
                    session,
                    key=key,
                    tool_name=tool_name,
                    owner=owner,
                    lease_seconds=lease_seconds,
                    scope_principal=scope_principal,
                )
            if claimed:
                return Acquired()
            async with self._transaction("claim") as session:
                held = await read_claim(session, key=key)
            if held is not None:
                return held
        return Busy(None)

    async def renew(self, key: str, *, owner: str, lease_seconds: float) -> bool:
        """Extend ``owner``'s pending claim; see ``IdempotencyStore.renew``.

        Raises:
            IdempotencyStoreUnavailable: the database failed.
        """
        async with self._transaction("renew") as session:
            return await renew_claim(session, key=key, owner=owner, lease_seconds=lease_seconds)

    async def complete(
        self,
        key: str,
        *,
        owner: str,
        outcome: StoredOutcome,
        ttl_seconds: int,
        also: CompleteHook | None = None,
    ) -> bool:
        """Store ``outcome`` for ``owner``'s claim; see ``IdempotencyStore.complete``.

        ``also(session, completed)`` runs in the same transaction after the update, so the
        caller's audit row commits together with the outcome, or neither does.

        Raises:
            IdempotencyStoreUnavailable: the database failed (nothing was committed).
        """
        async with self._transaction("complete") as session:
            completed = await complete_claim(
                session, key=key, owner=owner, outcome=outcome, ttl_seconds=ttl_seconds
            )
            if also is not None:
                await also(session, completed)
            return completed

    async def release(self, key: str, *, owner: str) -> None:
        """Drop ``owner``'s pending claim; see ``IdempotencyStore.release``.

        Raises:
            IdempotencyStoreUnavailable: the database failed.
        """
        async with self._transaction("release") as session:
            await release_claim(session, key=key, owner=owner)

    async def get(self, key: str) -> StoredOutcome | None:
        """Return the unexpired outcome of ``key``, or ``None``.

        Raises:
            IdempotencyStoreUnavailable: the database failed.
        """
        async with self._transaction("get") as session:
            return await get_outcome(session, key=key)

    async def put(
        self, key: str, outcome: StoredOutcome, *, ttl_seconds: int, tool_name: str = ""
    ) -> None:
        """Store an outcome directly, replacing any row; see ``IdempotencyStore.put``.

        Raises:
            IdempotencyStoreUnavailable: the database failed.
        """
        async with self._transaction("put") as session:
            await put_outcome(
                session, key=key, outcome=outcome, ttl_seconds=ttl_seconds, tool_name=tool_name
            )

    async def record(self, key: str) -> IdempotencyRecord | None:
        """Return a copy of the row stored under ``key`` (expired or not), or ``None``.

        Raises:
            IdempotencyStoreUnavailable: the database failed.
        """
        async with self._transaction("record") as session:
            return await get_record(session, key=key)

    async def purge_expired(self) -> int:
        """Delete expired outcomes; return how many. Correctness never depends on it.

        Raises:
            IdempotencyStoreUnavailable: the database failed.
        """
        async with self._transaction("purge") as session:
            return await purge_expired(session)
