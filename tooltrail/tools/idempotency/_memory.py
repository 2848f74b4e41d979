"""The in-memory store: ``InMemoryIdempotencyStore``, the store's semantics for one process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from tooltrail.tools.idempotency._store import (
    Acquired,
    Busy,
    Claim,
    Completed,
    CompleteHook,
    IdempotencyRecord,
    StoredOutcome,
    outcome_state,
    put_owner,
)

__all__ = ["InMemoryIdempotencyStore"]


@dataclass
class _MemoryRow:
    tool_name: str
    scope_principal: str | None
    state: Literal["pending", "succeeded", "failed"]
    owner: str
    lease_expires_at: datetime | None
    created_at: datetime
    outcome: StoredOutcome | None = None
    completed_at: datetime | None = None
    expires_at: datetime | None = None


def _system_clock() -> datetime:
    return datetime.now(UTC)


@dataclass
class InMemoryIdempotencyStore:
    """The store's semantics in a dict under an ``asyncio.Lock``, for one process.

    For unit tests and dispatchers built without a database.

    ``clock`` returns the current time as an aware ``datetime`` or as POSIX seconds; a fake
    clock makes leases and TTLs testable without sleeping.
    """

    clock: Callable[[], datetime | float] = _system_clock
    _rows: dict[str, _MemoryRow] = field(default_factory=dict, init=False, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)

    def _now(self) -> datetime:
        now = self.clock()
        if isinstance(now, datetime):
            return now if now.tzinfo is not None else now.replace(tzinfo=UTC)
        return datetime.fromtimestamp(now, UTC)

    @staticmethod
    def _claimable(row: _MemoryRow, now: datetime) -> bool:
        # The take-over condition of the SQL store, verbatim.
        if row.state == "pending":
            return row.lease_expires_at is not None and row.lease_expires_at < now
        return row.expires_at is not None and row.expires_at <= now

    async def claim(
        self,
        key: str,
        *,
        tool_name: str,
        owner: str,
        lease_seconds: float,
        scope_principal: str | None = None,
    ) -> Claim:
        """Claim ``key`` for ``owner``; see ``IdempotencyStore.claim``."""
        async with self._lock:
            now = self._now()
            row = self._rows.get(key)
            if row is None or self._claimable(row, now):
                self._rows[key] = _MemoryRow(
                    tool_name=tool_name,
                    scope_principal=scope_principal,
                    state="pending",
                    owner=owner,
                    lease_expires_at=now + timedelta(seconds=lease_seconds),
                    created_at=now,
                )
                return Acquired()
            if row.state == "pending":
                return Busy(row.lease_expires_at)
            assert row.outcome is not None
            return Completed(row.outcome)

    def _pending_of(self, key: str, owner: str) -> _MemoryRow | None:
        row = self._rows.get(key)
        if row is None or row.owner != owner or row.state != "pending":
            return None
        return row

    async def renew(self, key: str, *, owner: str, lease_seconds: float) -> bool:
        """Extend ``owner``'s pending claim; see ``IdempotencyStore.renew``."""
        async with self._lock:
            row = self._pending_of(key, owner)
            if row is None:
                return False
            row.lease_expires_at = self._now() + timedelta(seconds=lease_seconds)
            return True

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

        ``also`` runs first (with ``session=None``); if it raises, nothing changes.
        """
        async with self._lock:
            row = self._pending_of(key, owner)
            if also is not None:
                await also(None, row is not None)
            if row is None:
                return False
            now = self._now()
            row.state = outcome_state(outcome)
            row.outcome = outcome
            row.lease_expires_at = None
            row.completed_at = now
            row.expires_at = now + timedelta(seconds=ttl_seconds)
            return True

    async def release(self, key: str, *, owner: str) -> None:
        """Drop ``owner``'s pending claim; see ``IdempotencyStore.release``."""
        async with self._lock:
            if self._pending_of(key, owner) is not None:
                del self._rows[key]

    async def get(self, key: str) -> StoredOutcome | None:
        """Return the unexpired outcome of ``key``, or ``None``."""
        async with self._lock:
            row = self._rows.get(key)
            if row is None or row.state == "pending" or row.expires_at is None:
                return None
            return row.outcome if row.expires_at > self._now() else None

    async def put(
        self, key: str, outcome: StoredOutcome, *, ttl_seconds: int, tool_name: str = ""
    ) -> None:
        """Store an outcome directly; see ``IdempotencyStore.put``."""
        async with self._lock:
            now = self._now()
            old = self._rows.get(key)
            self._rows[key] = _MemoryRow(
                tool_name=tool_name or (old.tool_name if old else ""),
                scope_principal=old.scope_principal if old else None,
                state=outcome_state(outcome),
                owner=put_owner(outcome),
                lease_expires_at=None,
                created_at=now,
                outcome=outcome,
                completed_at=now,
                expires_at=now + timedelta(seconds=ttl_seconds),
            )

    async def record(self, key: str) -> IdempotencyRecord | None:
        """Return a copy of the row stored under ``key`` (expired or not), or ``None``."""
        async with self._lock:
            row = self._rows.get(key)
            if row is None:
                return None
            return IdempotencyRecord(
                key=key,
                tool_name=row.tool_name,
                scope_principal=row.scope_principal,
                state=row.state,
                owner=row.owner,
                lease_expires_at=row.lease_expires_at,
                outcome=row.outcome,
                source_call_id=row.outcome.source_call_id if row.outcome else None,
                created_at=row.created_at,
                completed_at=row.completed_at,
                expires_at=row.expires_at,
            )

    async def purge_expired(self) -> int:
        """Delete expired outcomes; return how many. Correctness never depends on it."""
        async with self._lock:
            now = self._now()
            gone = [
                key
                for key, row in self._rows.items()
                if row.state != "pending" and row.expires_at is not None and row.expires_at <= now
            ]
            for key in gone:
                del self._rows[key]
            return len(gone)
