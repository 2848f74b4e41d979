"""The store's contract: ``IdempotencyStore``, the claims it answers and the outcomes it keeps.

A claim is ``Acquired``, ``Completed`` or ``Busy``; ``StoredOutcome`` and
``IdempotencyRecord`` are what a completed key holds. It imports no SQL (the SQL store is
``tooltrail.db.idempotency``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, TypeAlias

from pydantic import BaseModel, ConfigDict, field_validator
from pydantic_core import to_jsonable_python

__all__ = [
    "Acquired",
    "Busy",
    "Claim",
    "CompleteHook",
    "Completed",
    "IdempotencyRecord",
    "IdempotencyStore",
    "StoredOutcome",
    "outcome_state",
    "put_owner",
]


class StoredOutcome(BaseModel):
    """A call's outcome as the store keeps it; ``value`` is JSON (normalized on creation)."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    """Whether the body returned (``True``) or raised (``False``)."""
    value: Any = None
    """The JSON-normalized return value of a success."""
    error_type: str | None = None
    """The exception's class name, for a failure."""
    message: str | None = None
    """``str()`` of the exception, for a failure."""
    source_call_id: str | None = None
    """The call whose body produced the outcome."""
    audit: dict[str, Any] | None = None
    """The audit row of the dispatch that completed it, committed with it (spec §5.5): a
    Temporal retry of that same attempt, after its worker was lost, reports this row."""

    @field_validator("value", mode="before")
    @classmethod
    def _jsonable(cls, value: Any) -> Any:
        return to_jsonable_python(value)


@dataclass(frozen=True)
class Acquired:
    """The caller owns the key's claim and must run the body."""


@dataclass(frozen=True)
class Completed:
    """The key has an unexpired outcome; the body must not run."""

    outcome: StoredOutcome


@dataclass(frozen=True)
class Busy:
    """Another owner holds a live claim on the key."""

    lease_expires_at: datetime | None
    """When that claim lapses unless renewed (database clock), if known."""


Claim: TypeAlias = Acquired | Completed | Busy

CompleteHook: TypeAlias = Callable[[Any, bool], Awaitable[None]]
"""``also(session, completed)`` run inside ``complete``'s transaction, after its update.

``session`` is the store's open transaction: the SQL store's ``AsyncSession``, ``None`` for
the in-memory store (typed ``Any`` so that this module needs no SQL); ``completed`` is
``False`` when the claim was no longer this owner's (the lease was lost). If the hook raises,
nothing of the transaction is committed.
"""


class IdempotencyStore(Protocol):
    """Where claims and outcomes live (spec §5.3). Expired entries read as misses."""

    async def claim(
        self,
        key: str,
        *,
        tool_name: str,
        owner: str,
        lease_seconds: float,
        scope_principal: str | None = None,
    ) -> Claim:
        """Claim ``key`` for ``owner``, or report its outcome or its live claim.

        ``scope_principal`` (the principal whose scope the key is in, ``None`` for a global
        key) is recorded with a new claim; it is passed only when set, so a store written
        before it existed still works for global keys.
        """
        ...

    async def renew(self, key: str, *, owner: str, lease_seconds: float) -> bool:
        """Extend ``owner``'s pending claim; ``False`` if it is no longer theirs."""
        ...

    async def complete(
        self,
        key: str,
        *,
        owner: str,
        outcome: StoredOutcome,
        ttl_seconds: int,
        also: CompleteHook | None = None,
    ) -> bool:
        """Store ``outcome`` if ``owner`` still holds the pending claim; ``False`` if not."""
        ...

    async def release(self, key: str, *, owner: str) -> None:
        """Drop ``owner``'s pending claim (no-op if it is not theirs)."""
        ...

    async def get(self, key: str) -> StoredOutcome | None:
        """Return the unexpired outcome of ``key``, or ``None``."""
        ...

    async def put(self, key: str, outcome: StoredOutcome, *, ttl_seconds: int) -> None:
        """Store an outcome for ``key`` directly (tests, operations); replaces any row."""
        ...


class IdempotencyRecord(BaseModel):
    """A read-only copy of one stored key, for tests and operators."""

    key: str
    tool_name: str
    scope_principal: str | None
    state: Literal["pending", "succeeded", "failed"]
    owner: str
    lease_expires_at: datetime | None
    outcome: StoredOutcome | None
    source_call_id: str | None
    created_at: datetime
    completed_at: datetime | None
    expires_at: datetime | None


def outcome_state(outcome: StoredOutcome) -> Literal["succeeded", "failed"]:
    """The stored ``state`` of a completed key with this outcome."""
    return "succeeded" if outcome.ok else "failed"


def put_owner(outcome: StoredOutcome) -> str:
    """The ``owner`` recorded for an outcome stored with ``put`` (no claim ever held it)."""
    return f"put:{outcome.source_call_id}" if outcome.source_call_id else "put"
