"""Resolution (spec §5.5): ``run_idempotent`` claims the key, waits, serves or runs the body.

An owner renews its lease while the body runs and then records the outcome under the key;
``busy_text`` and ``owner_of`` give the busy text and the claim's owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, assert_never

from pydantic_core import to_jsonable_python

from tooltrail.tools.idempotency._errors import CachedToolError, IdempotencyStoreUnavailable
from tooltrail.tools.idempotency._policy import Idempotency
from tooltrail.tools.idempotency._store import (
    Acquired,
    Busy,
    Completed,
    CompleteHook,
    IdempotencyStore,
    StoredOutcome,
)

__all__ = ["IdempotentResult", "OutcomeHook", "busy_text", "owner_of", "run_idempotent"]

log = logging.getLogger("tooltrail.idempotency")

_POLL_FIRST_S = 0.1
_POLL_MAX_S = 2.0
_COMPLETE_TRIES = 3
_COMPLETE_BACKOFF_S = 0.1
_COMPLETE_MAX_DELAY_S = 2.0
_COMPLETE_PATIENCE_S = 30.0
"""How long an owner keeps trying to record its outcome (heartbeating meanwhile)."""

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
