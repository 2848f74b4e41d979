"""Idempotency of tool calls: policies, keys, the leased claim store and the resolution loop.

Spec: ``guardrails-idempotency-access.md`` §5. A call of an idempotent tool is identified by a
key derived from the tool name, the scope (the principal, or nothing) and the effective
snapshot of its arguments. Before the body runs, the caller *claims* the key in a shared
store. The claim is a lease, renewed while the body runs, so a crashed owner is taken over
once its lease lapses, while a live one (even a zombie attempt Temporal already retried) is
waited for. When the body finishes, its outcome is committed under the key for
``ttl_seconds``. Every later call with the same key gets that outcome and the body does not
run again.

This module is the logic and the store's contract, with an in-memory store for one process;
it imports no SQL. The shared store is ``tooltrail.db.idempotency.SqlIdempotencyStore``, in the
database layer: it compares times only with the database's clock, so workers with skewed
clocks still agree on who holds a lease and when an outcome expires, and it holds no
transaction while a body runs.

Exceptions raised here::

    TooltrailError
    ├── IdempotencyKeyError           an explicit key function failed (not retryable)
    ├── CachedToolError               a cached failure was hit (not retryable)
    └── IdempotencyStoreUnavailable   the store could not be reached (retryable)
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol, TypeAlias, assert_never

from pydantic import BaseModel, ConfigDict, field_validator
from pydantic_core import to_jsonable_python

from tooltrail.core.text import canonical_json
from tooltrail.errors import ToolDefinitionError, TooltrailError

__all__ = [
    "KEY_VERSION",
    "Acquired",
    "Busy",
    "CachedToolError",
    "Claim",
    "CompleteHook",
    "Completed",
    "Idempotency",
    "IdempotencyDeclaration",
    "IdempotencyKeyError",
    "IdempotencyRecord",
    "IdempotencyStore",
    "IdempotencyStoreUnavailable",
    "IdempotentResult",
    "InMemoryIdempotencyStore",
    "OutcomeHook",
    "StoredOutcome",
    "busy_text",
    "canonical_snapshot_text",
    "derive_key",
    "outcome_state",
    "owner_of",
    "put_owner",
    "resolve_idempotency",
    "run_idempotent",
]

log = logging.getLogger("tooltrail.idempotency")

KEY_VERSION = "tooltrail-idem/1"
"""The first element of the hashed key material; bump it to invalidate every stored key."""

_POLL_FIRST_S = 0.1
_POLL_MAX_S = 2.0
_COMPLETE_TRIES = 3
_COMPLETE_BACKOFF_S = 0.1
_COMPLETE_MAX_DELAY_S = 2.0
_COMPLETE_PATIENCE_S = 30.0
"""How long an owner keeps trying to record its outcome (heartbeating meanwhile)."""

# -- errors ----------------------------------------------------------------------------------


class IdempotencyKeyError(TooltrailError):
    """Raised when an explicit key function raises or returns anything but a non-empty ``str``.

    The body does not run and the store is untouched; retrying cannot help (not retryable).
    """


class CachedToolError(TooltrailError):
    """Raised when a call hits a cached failure (``Idempotency(cache_failures=True)``).

    The body does not run; the error repeats the original failure's type name and message.
    """

    def __init__(self, error_type: str, message: str, source_call_id: str | None = None) -> None:
        """Create the error.

        Args:
            error_type: the class name of the exception the original body raised.
            message: ``str()`` of that exception.
            source_call_id: the call whose body failed.
        """
        super().__init__(error_type, message, source_call_id)
        self.error_type = error_type
        self.message = message
        self.source_call_id = source_call_id

    def __str__(self) -> str:
        return f"{self.error_type}: {self.message}" if self.message else self.error_type


class IdempotencyStoreUnavailable(TooltrailError):
    """Raised when the idempotency store cannot be read or written (retryable).

    An idempotent body never runs without a claim: the call fails closed and Temporal retries
    the activity.
    """


# -- policy ----------------------------------------------------------------------------------

_STRATEGIES = ("hash_input", "explicit", "none")
_SCOPES = ("principal", "global")


@dataclass(frozen=True)
class Idempotency:
    """How a tool's calls are deduplicated (spec §5.1).

    ``Idempotency()`` hashes the effective arguments and scopes the key to the principal.
    Check a policy with ``validate_for`` when the tool is registered.
    """

    strategy: Literal["hash_input", "explicit", "none"] = "hash_input"
    """``hash_input``: the key material is the snapshot; ``explicit``: ``key(model)``;
    ``none``: not idempotent (opts out of a class or module default)."""
    key: Callable[[BaseModel], str] | None = None
    """The key function of the ``explicit`` strategy; it receives the frozen model."""
    ttl_seconds: int = 3600
    """How long an outcome is served, from completion; hits do not extend it."""
    cache_failures: bool = False
    """Whether a failure is cached too (then hits raise ``CachedToolError``)."""
    scope: Literal["principal", "global"] = "principal"
    """``principal``: each principal has its own keys; ``global``: one key for everyone."""
    lease_seconds: float = 60.0
    """How long a claim lives without renewal; renewed every third of it while the body runs."""
    wait_timeout_seconds: float = 90.0
    """How long a call waits for another in-flight call with the same key."""

    def validate_for(self, tool_name: str) -> None:
        """Check the policy of the tool ``tool_name``; called at registration.

        Raises:
            ToolDefinitionError: ``explicit`` without ``key``, ``key`` with another strategy,
                ``ttl_seconds <= 0``, ``lease_seconds <= 0``,
                ``wait_timeout_seconds < lease_seconds``, or an unknown strategy or scope.
        """
        where = f"idempotency policy of tool {tool_name!r}"
        if self.strategy not in _STRATEGIES:
            raise ToolDefinitionError(
                f"{where}: unknown strategy {self.strategy!r}; use one of {', '.join(_STRATEGIES)}"
            )
        if self.scope not in _SCOPES:
            raise ToolDefinitionError(
                f"{where}: unknown scope {self.scope!r}; use 'principal' or 'global'"
            )
        if self.strategy == "explicit" and self.key is None:
            raise ToolDefinitionError(
                f"{where}: strategy 'explicit' needs a key function (key=lambda model: ...)"
            )
        if self.strategy != "explicit" and self.key is not None:
            raise ToolDefinitionError(
                f"{where}: a key function needs strategy='explicit', not {self.strategy!r}"
            )
        if self.key is not None and not callable(self.key):
            raise ToolDefinitionError(f"{where}: key must be callable")
        if isinstance(self.ttl_seconds, bool) or not isinstance(self.ttl_seconds, int):
            raise ToolDefinitionError(f"{where}: ttl_seconds must be an int")
        if self.ttl_seconds <= 0:
            raise ToolDefinitionError(f"{where}: ttl_seconds must be > 0, got {self.ttl_seconds}")
        if not math.isfinite(self.lease_seconds) or self.lease_seconds <= 0:
            raise ToolDefinitionError(
                f"{where}: lease_seconds must be > 0, got {self.lease_seconds}"
            )
        if not self.wait_timeout_seconds >= self.lease_seconds:
            raise ToolDefinitionError(
                f"{where}: wait_timeout_seconds ({self.wait_timeout_seconds}) must be >= "
                f"lease_seconds ({self.lease_seconds}), so a waiter outlives a dead owner's lease"
            )


IdempotencyDeclaration: TypeAlias = bool | Idempotency | None
"""What ``@tool(idempotent=...)``, ``@tool_defaults(idempotent=...)`` and
``ToolDefaults(idempotent=...)`` accept.

``True`` means ``Idempotency()``; ``False`` means not idempotent; a policy is used as given
(``strategy="none"``: not idempotent); ``None`` declares nothing at this level, so the next
one decides: a tool's ``None`` inherits its class's ``@tool_defaults``, then its module's
``TOOLTRAIL_DEFAULTS``, and when nobody declares anything the tool is not idempotent.
"""


def resolve_idempotency(value: IdempotencyDeclaration) -> Idempotency | None:
    """Return the effective policy of a declaration, or ``None`` when the store is not used.

    ``True`` means ``Idempotency()``; ``False``, ``None`` (nothing declared anywhere) and a
    policy with ``strategy="none"`` mean "not idempotent". Apply it to the *nearest*
    declaration (method, then class, then module): it replaces the others wholesale. It does
    not validate; call ``Idempotency.validate_for`` at registration.

    Raises:
        ToolDefinitionError: ``value`` is neither a bool, an ``Idempotency`` nor ``None``.
    """
    if value is None or value is False:
        return None
    if value is True:
        return Idempotency()
    if isinstance(value, Idempotency):
        return None if value.strategy == "none" else value
    raise ToolDefinitionError(
        f"idempotent must be True, False or an Idempotency(...) policy, got {value!r}"
    )


# -- keys ------------------------------------------------------------------------------------


def _model_of(snapshot_or_model: Any) -> BaseModel:
    if isinstance(snapshot_or_model, BaseModel):
        return snapshot_or_model
    model = getattr(snapshot_or_model, "model", None)
    if isinstance(model, BaseModel):
        return model
    raise TypeError(
        "expected a pydantic model or a snapshot with a .model attribute, "
        f"got {type(snapshot_or_model).__name__!r}"
    )


def canonical_snapshot_text(model: BaseModel) -> str:
    """Return the canonical JSON text of a materialized model (spec §4.3), decoded.

    Raises:
        ValueError: the model holds a non-finite float.
    """
    return json.dumps(
        model.model_dump(mode="json"),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def derive_key(
    tool_name: Any,
    snapshot_or_model: Any,
    principal: Any = None,
    *,
    policy: Idempotency | None = None,
    principal_id: str | None = None,
) -> str:
    """Return the idempotency key of a call (spec §5.2): 64 lowercase hex digits.

    ``sha256(canonical_json([KEY_VERSION, tool_name, scope_id, material]))`` where
    ``scope_id`` is ``principal_id`` (``None`` for ``scope="global"``) and ``material`` is
    the snapshot's canonical JSON text (``hash_input``) or ``policy.key(model)``
    (``explicit``).

    Args:
        tool_name: the registered tool name.
        snapshot_or_model: the materialized pydantic model, or a snapshot with ``.model``.
        principal: with a ``Tool``, the ``Principal`` (or its id) whose scope the key is in.
        policy: the tool's policy; its strategy must not be ``"none"``.
        principal_id: the configured principal's id, or ``None`` when there is none.

    The spec's form (§5.2) also works: ``derive_key(tool, arguments, principal=None)`` with
    a registered ``Tool`` and raw arguments runs the guardrails' steps 3a-3d (no side
    effects) and uses the tool's own policy, giving exactly the key dispatch would use.

    Raises:
        IdempotencyKeyError: the explicit key function raised or returned anything but a
            non-empty ``str``.
        ValueError: the policy's strategy is ``"none"`` (or the tool is not idempotent), or
            the snapshot holds inf/NaN.
        TypeError: ``snapshot_or_model`` is neither a model nor a snapshot.
    """
    if not isinstance(tool_name, str):
        # The spec's form: a Tool, its raw arguments, and the principal.
        tool = tool_name
        resolved = resolve_idempotency(tool.idempotent)
        if resolved is None or resolved.strategy == "none":
            raise ValueError(f"tool {tool.name!r} is not idempotent: it has no key")
        snapshot = tool.validate(dict(snapshot_or_model or {}))
        principal_of = getattr(principal, "id", principal)
        return derive_key(tool.name, snapshot, policy=resolved, principal_id=principal_of)
    if policy is None:
        raise TypeError("derive_key(tool_name, snapshot, ...) needs policy=")
    model = _model_of(snapshot_or_model)
    canonical = getattr(snapshot_or_model, "canonical", None)
    if policy.strategy == "hash_input":
        # The snapshot's bytes were computed once when the arguments were frozen (spec §4.3).
        material = (
            canonical.decode("utf-8")
            if isinstance(canonical, bytes)
            else canonical_snapshot_text(model)
        )
    elif policy.strategy == "explicit":
        material = _explicit_material(tool_name, model, policy)
    else:
        raise ValueError(f"tool {tool_name!r} is not idempotent (strategy 'none'): it has no key")
    scope_id = principal_id if policy.scope == "principal" else None
    text = canonical_json([KEY_VERSION, tool_name, scope_id, material])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _explicit_material(tool_name: str, model: BaseModel, policy: Idempotency) -> str:
    if policy.key is None:
        raise IdempotencyKeyError(f"tool {tool_name!r}: strategy 'explicit' has no key function")
    try:
        # A deep copy: a key function that mutates nested values cannot alter the snapshot.
        material: object = policy.key(model.model_copy(deep=True))
    except Exception as exc:
        raise IdempotencyKeyError(
            f"the idempotency key function of tool {tool_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(material, str) or not material:
        raise IdempotencyKeyError(
            f"the idempotency key function of tool {tool_name!r} must return a non-empty str, "
            f"got {material!r}"
        )
    return material


# -- store contract --------------------------------------------------------------------------


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


# -- in-memory store -------------------------------------------------------------------------


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


# -- resolution (spec §5.5) ------------------------------------------------------------------

OutcomeHook: TypeAlias = Callable[[Any, StoredOutcome, bool], Awaitable[None]]
"""``on_complete(session, outcome, completed)``: the caller's share of the completing
transaction (its audit row); ``session`` as for ``CompleteHook``. ``completed=False`` means the
lease was lost."""


@dataclass(frozen=True)
class IdempotentResult:
    """What ``run_idempotent`` produced, when it did not raise."""

    status: Literal["ok", "cache_hit", "idempotency_busy"]
    """``ok``: this call ran the body; ``cache_hit``: a stored outcome was served;
    ``idempotency_busy``: another call kept the key past the wait timeout."""
    key: str
    """The idempotency key."""
    value: Any = None
    """The JSON-normalized value (``ok`` and ``cache_hit``)."""
    text: str | None = None
    """The model-facing text (``idempotency_busy``)."""
    source_call_id: str | None = None
    """The call whose body produced ``value``."""
    lease_lost: bool = False
    """``ok`` only: the claim was taken over while the body ran, so nothing was cached."""
    audit: dict[str, Any] | None = None
    """``cache_hit`` only: the audit row stored with the outcome (``StoredOutcome.audit``)."""

    @property
    def is_error(self) -> bool:
        """Whether this is a soft error."""
        return self.status == "idempotency_busy"


def busy_text(tool_name: str, waited_seconds: float) -> str:
    """The exact text of an ``idempotency_busy`` result."""
    return (
        f"idempotency busy: tool '{tool_name}' is already running with the same arguments; "
        f"gave up after {waited_seconds:g}s"
    )


def owner_of(call_id: str, attempt: int, fence: str | None = None) -> str:
    """The owner of a claim: ``f"{call_id}#{attempt}"``, fenced with ``@fence`` if given.

    A model's call ids repeat across turns (``call_0`` in every session), and a recovery
    retry of a call runs as Temporal attempt 1 again: without the fence, two executions
    could share an owner, and a stale one (a paused worker whose lease lapsed and was taken
    over) would renew and commit the new holder's claim as if it were still its own. The
    fence makes the owner one execution's: a stale owner's ``renew``/``complete`` match no
    row, and its result is reported with ``lease_lost=True``.
    """
    owner = f"{call_id}#{attempt}"
    return owner if fence is None else f"{owner}@{fence}"


def _hit(key: str, outcome: StoredOutcome) -> IdempotentResult:
    if not outcome.ok:
        raise CachedToolError(
            outcome.error_type or "Exception", outcome.message or "", outcome.source_call_id
        )
    return IdempotentResult(
        status="cache_hit",
        key=key,
        value=outcome.value,
        source_call_id=outcome.source_call_id,
        audit=outcome.audit,
    )


def _takes_scope(store: IdempotencyStore) -> bool:
    """Whether ``store.claim`` takes ``scope_principal`` (stores written before it do not)."""
    try:
        parameters = inspect.signature(store.claim).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.name == "scope_principal" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters
    )


async def run_idempotent(
    store: IdempotencyStore,
    *,
    key: str,
    policy: Idempotency,
    tool_name: str,
    call_id: str,
    attempt: int,
    body: Callable[[], Awaitable[Any]],
    heartbeat: Callable[[], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    on_complete: OutcomeHook | None = None,
    fence: str | None = None,
    scope_principal: str | None = None,
    audit_row: Callable[[Any], dict[str, Any] | None] | None = None,
) -> IdempotentResult:
    """Run ``body`` at most once per key (spec §5.5): claim, then run, hit or wait.

    - **Acquired:** run the body, renewing the lease every ``lease_seconds / 3`` (and calling
      ``heartbeat``). A success is completed (``on_complete`` joins that transaction, which
      is tried up to 3 times). If the claim was taken over meanwhile, the result is still
      returned, uncached, with ``lease_lost=True``. If the body raises, the failure is
      completed (``cache_failures``) or the claim released, and the same exception
      propagates. On cancellation the claim is released (best effort).
    - **Completed:** a success is a ``cache_hit``; a cached failure raises ``CachedToolError``.
    - **Busy:** poll ``claim`` with backoff (0.1 s doubling, at most 2 s), calling
      ``heartbeat`` each time, until the claim resolves or ``wait_timeout_seconds`` pass;
      then the result is ``idempotency_busy``.

    Args:
        store: the idempotency store.
        key: the call's key (``derive_key``).
        policy: the tool's policy.
        tool_name: the tool name (for the claim and the busy text).
        call_id: the model's tool-call id; the claim's owner is ``f"{call_id}#{attempt}"``.
        attempt: the Temporal activity attempt.
        body: runs the tool body once; its value is JSON-normalized and cached.
        heartbeat: called while the body runs and while waiting (an activity heartbeat).
        sleep: waits between polls and retries (replaceable in tests).
        on_complete: the caller's writes to join the completing transaction.
        fence: what makes this execution's owner unique (``owner_of``); inside a worker, the
            activity execution.
        scope_principal: the principal whose scope the key is in (``None``: global), for
            the record.
        audit_row: builds the caller's audit row of a success from its value; the row is
            stored with the outcome, in the completing statement (``StoredOutcome.audit``).

    Raises:
        CachedToolError: a cached failure was hit.
        IdempotencyStoreUnavailable: the store failed; the body did not run, or its outcome
            could not be recorded.
        BaseException: whatever the body raised, the same instance.
    """
    owner = owner_of(call_id, attempt, fence)
    started = time.monotonic()
    slept = 0.0
    delay = _POLL_FIRST_S
    while True:
        scoped = (
            {}
            if scope_principal is None or not _takes_scope(store)
            else {"scope_principal": scope_principal}
        )
        claim = await store.claim(
            key, tool_name=tool_name, owner=owner, lease_seconds=policy.lease_seconds, **scoped
        )
        if isinstance(claim, Acquired):
            return await _run_owned(
                store,
                key=key,
                owner=owner,
                policy=policy,
                call_id=call_id,
                body=body,
                heartbeat=heartbeat,
                sleep=sleep,
                on_complete=on_complete,
                audit_row=audit_row,
            )
        if isinstance(claim, Completed):
            return _hit(key, claim.outcome)
        if isinstance(claim, Busy):
            # Elapsed time is the larger of the wall clock and the time slept, so a fake
            # sleep in tests still reaches the timeout.
            remaining = policy.wait_timeout_seconds - max(time.monotonic() - started, slept)
            if remaining <= 0:
                return IdempotentResult(
                    status="idempotency_busy",
                    key=key,
                    text=busy_text(tool_name, policy.wait_timeout_seconds),
                )
            pause = min(delay, remaining)
            await sleep(pause)
            slept += pause
            delay = min(delay * 2, _POLL_MAX_S)
            if heartbeat is not None:
                heartbeat()
            continue
        assert_never(claim)


async def _renew_until(
    stop: asyncio.Event,
    store: IdempotencyStore,
    *,
    key: str,
    owner: str,
    lease_seconds: float,
    heartbeat: Callable[[], None] | None,
) -> None:
    # Never raises: a failed renewal only risks a take-over, which `complete` then reports.
    interval = lease_seconds / 3
    renewing = True
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)
        if stop.is_set():
            return
        if heartbeat is not None:
            try:
                heartbeat()
            except Exception:
                log.warning("heartbeat failed for idempotency key %s", key, exc_info=True)
        if not renewing:
            continue
        try:
            if not await store.renew(key, owner=owner, lease_seconds=lease_seconds):
                log.warning(
                    "lease of idempotency key %s was taken over from %r while its body ran",
                    key,
                    owner,
                )
                renewing = False
        except Exception:
            log.warning("could not renew idempotency key %s", key, exc_info=True)


async def _release_quietly(store: IdempotencyStore, key: str, owner: str) -> None:
    try:
        await asyncio.shield(store.release(key, owner=owner))
    except Exception:
        # The lease runs out on its own; the next call then takes over.
        log.warning("could not release idempotency key %s of %r", key, owner, exc_info=True)


async def _complete(
    store: IdempotencyStore,
    *,
    key: str,
    owner: str,
    outcome: StoredOutcome,
    ttl_seconds: int,
    sleep: Callable[[float], Awaitable[None]],
    on_complete: OutcomeHook | None,
    lease_seconds: float = 0.0,
    heartbeat: Callable[[], None] | None = None,
) -> bool:
    """Record the outcome (with the caller's audit row, in one transaction).

    Tried at least ``_COMPLETE_TRIES`` times (the spec's minimum), then on for up to
    ``_COMPLETE_PATIENCE_S`` (or most of the lease, if longer), or, with a ``heartbeat``
    (inside an activity), until it lands, heartbeating meanwhile:
    giving up would make the activity's retry wait out the lease and run the body a second
    time, so a short database outage would turn an idempotent side effect into two.
    """
    also: CompleteHook | None = None
    if on_complete is not None:
        hook = on_complete

        async def join(session: Any, completed: bool) -> None:
            await hook(session, outcome, completed)

        also = join

    patience = max(lease_seconds * 0.8, _COMPLETE_PATIENCE_S)
    started = time.monotonic()
    slept = 0.0
    attempt = 0
    while True:
        try:
            if also is None:
                # Stores that follow the spec's contract verbatim need not know `also`.
                return await store.complete(
                    key, owner=owner, outcome=outcome, ttl_seconds=ttl_seconds
                )
            return await store.complete(
                key, owner=owner, outcome=outcome, ttl_seconds=ttl_seconds, also=also
            )
        except IdempotencyStoreUnavailable:
            delay = min(_COMPLETE_BACKOFF_S * 2**attempt, _COMPLETE_MAX_DELAY_S)
            attempt += 1
            # Elapsed is the larger of wall time and time slept, so a fake sleep ends it too.
            elapsed = max(time.monotonic() - started, slept)
            # Inside an activity (a heartbeat to call) the owner keeps trying until the
            # outcome lands: the body returned, and failing the activity would make Temporal
            # run it again once the lease lapsed. Cancellation or the activity's timeout end
            # the wait; a lease lost meanwhile is reported (``lease_lost``), not hidden.
            if attempt >= _COMPLETE_TRIES and elapsed + delay > patience and heartbeat is None:
                raise
            log.warning("completing idempotency key %s failed; retrying", key, exc_info=True)
            if heartbeat is not None:
                heartbeat()
            await sleep(delay)
            slept += delay


async def _run_owned(
    store: IdempotencyStore,
    *,
    key: str,
    owner: str,
    policy: Idempotency,
    call_id: str,
    body: Callable[[], Awaitable[Any]],
    heartbeat: Callable[[], None] | None,
    sleep: Callable[[float], Awaitable[None]],
    on_complete: OutcomeHook | None,
    audit_row: Callable[[Any], dict[str, Any] | None] | None = None,
) -> IdempotentResult:
    stop = asyncio.Event()
    renewer = asyncio.create_task(
        _renew_until(
            stop,
            store,
            key=key,
            owner=owner,
            lease_seconds=policy.lease_seconds,
            heartbeat=heartbeat,
        )
    )
    try:
        try:
            value = to_jsonable_python(await body())
        finally:
            stop.set()
            try:
                await renewer
            except asyncio.CancelledError:
                renewer.cancel()
                raise
    except Exception as exc:
        if not policy.cache_failures:
            await _release_quietly(store, key, owner)
            raise
        failure = StoredOutcome(
            ok=False, error_type=type(exc).__name__, message=str(exc), source_call_id=call_id
        )
        await _complete(
            store,
            key=key,
            owner=owner,
            outcome=failure,
            ttl_seconds=policy.ttl_seconds,
            sleep=sleep,
            on_complete=on_complete,
            heartbeat=heartbeat,
        )
        raise
    except BaseException:
        # Cancellation (or an interpreter exit): give the key back so nobody waits a lease.
        await _release_quietly(store, key, owner)
        raise
    success = StoredOutcome(
        ok=True,
        value=value,
        source_call_id=call_id,
        audit=None if audit_row is None else audit_row(value),
    )
    completed = await _complete(
        store,
        key=key,
        owner=owner,
        outcome=success,
        ttl_seconds=policy.ttl_seconds,
        sleep=sleep,
        on_complete=on_complete,
        heartbeat=heartbeat,
    )
    return IdempotentResult(
        status="ok",
        key=key,
        value=success.value,
        source_call_id=call_id,
        lease_lost=not completed,
    )
