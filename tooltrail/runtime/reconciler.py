"""Reconciliation: turns that ended outside tooltrail get their true status in SQL.

A turn's workflow writes its own final status, but Temporal can end a workflow without
running its code: ``temporal workflow terminate``, an execution timeout, a cancellation or
failure no worker recorded. Such a turn's row would say ``running`` for ever. Reconciliation
asks Temporal (one ``describe`` per turn, and the close event of those that closed) and moves
the row to what Temporal reports (``completed``, ``failed``, ``cancelled``, ``terminated``,
``timed_out``), with a ``turn_reconciled`` event after the turn's last one that says what
Temporal reported. A turn Temporal no longer knows (its history deleted by retention) is
reported as such and left as it is: how it ended cannot be known any more.

``Tooltrail.reconcile()`` and ``tooltrail audit reconcile`` do it on demand; workers do it in
the background (``BackgroundReconciler``), one worker of a deployment at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, Field
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistoryEventFilterType
from temporalio.service import RPCError, RPCStatusCode

from tooltrail.db.reconcile import (
    close_turn,
    mark_checked,
    release_lease,
    running_turns,
    take_lease,
)
from tooltrail.db.store import AuditStore
from tooltrail.settings import Settings

__all__ = [
    "LEASE_NAME",
    "BackgroundReconciler",
    "ReconcileReport",
    "ReconciledTurn",
    "background_reconciliation",
    "describe_turn",
    "reconcile",
    "reconcile_turns",
    "temporal_status",
]

log = logging.getLogger("tooltrail.reconcile")

LEASE_NAME = "reconcile"
"""The ``maintenance_lease`` row background reconciliation holds."""

_STATUS = {
    WorkflowExecutionStatus.RUNNING: "running",
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed_out",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "continued_as_new",
}
_CLOSED = frozenset({"completed", "failed", "cancelled", "terminated", "timed_out"})
"""Temporal's statuses a turn row can take (a turn never continues as new)."""
_ERROR_TYPES = {
    "failed": "WorkflowFailed",
    "cancelled": "WorkflowCancelled",
    "terminated": "WorkflowTerminated",
    "timed_out": "WorkflowTimedOut",
}
_DESCRIBES = 8
"""Describe calls in flight at once."""


def temporal_status(status: WorkflowExecutionStatus | None) -> str:
    """Tooltrail's name of a Temporal execution status (``timed_out``, ``terminated``, ...)."""
    return _STATUS.get(status, "unknown") if status is not None else "unknown"


class ReconciledTurn(BaseModel):
    """What Temporal reported about one turn, and what reconciliation did with it."""

    turn_id: str
    temporal_status: str
    """``running``, ``completed``, ``failed``, ``cancelled``, ``terminated``, ``timed_out``,
    ``continued_as_new``, or ``not_found`` (no such workflow: never started here, or its
    history was deleted by the namespace's retention)."""
    status: str | None = None
    """The status written to the turn's row; ``None`` when the row was left as it was."""
    run_id: str | None = None
    """The run Temporal described (the latest of the turn's workflow id)."""
    closed_at: datetime | None = None
    detail: str = ""
    """Temporal's words: the termination reason, the failure, the timeout."""


class ReconcileReport(BaseModel):
    """The outcome of one reconciliation."""

    checked: int = 0
    """Turns whose row said ``running`` and that Temporal was asked about."""
    changed: list[ReconciledTurn] = Field(default_factory=list)
    """Turns whose row moved to the status Temporal reported."""
    missing: list[ReconciledTurn] = Field(default_factory=list)
    """Turns Temporal does not know (history deleted by retention): left ``running``."""
    still_running: int = 0
    """Turns that are running in Temporal too."""


async def _close_detail(client: Client, turn_id: str, run_id: str, status: str) -> str:
    """Temporal's words about how a run closed, from its close event (best effort)."""
    handle = client.get_workflow_handle(turn_id, run_id=run_id)
    event: HistoryEvent | None = None
    async for found in handle.fetch_history_events(
        event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT
    ):
        event = found
    if event is None:
        return status
    if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
        attrs = event.workflow_execution_terminated_event_attributes
        by = f" by {attrs.identity}" if attrs.identity else ""
        return f"terminated{by}: {attrs.reason or 'no reason given'}"
    if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT:
        return "the workflow's execution timeout passed"
    if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
        failure = event.workflow_execution_failed_event_attributes.failure
        try:
            # With the codec on the message is encrypted: the client's converter has the keys.
            error = await client.data_converter.decode_failure(failure)
            return f"failed: {error}"
        except Exception:  # a detail only; the status is what matters
            return f"failed: {failure.message}"
    if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED:
        return "cancelled"
    return status


async def describe_turn(client: Client, turn_id: str) -> ReconciledTurn:
    """Ask Temporal how a turn's workflow stands (its latest run).

    Raises:
        RPCError: Temporal could not answer (other than "not found").
    """
    try:
        description = await client.get_workflow_handle(turn_id).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return ReconciledTurn(
                turn_id=turn_id,
                temporal_status="not_found",
                detail="Temporal has no workflow with this id: it never ran on this namespace, "
                "or its history was deleted by the namespace's retention",
            )
        raise
    status = temporal_status(description.status)
    view = ReconciledTurn(
        turn_id=turn_id,
        temporal_status=status,
        run_id=description.run_id,
        closed_at=description.close_time,
    )
    if status in _CLOSED and status != "completed":
        view.detail = await _close_detail(client, turn_id, description.run_id, status)
    return view


async def reconcile_turns(
    client: Client, store: AuditStore, turn_ids: Sequence[str], *, by: str
) -> list[ReconciledTurn]:
    """Ask Temporal about each turn; move those it reports closed to their true status.

    Args:
        client: the Temporal client.
        store: the audit database.
        turn_ids: the turns to check (their rows say ``running``).
        by: who reconciles (``reconcile`` on demand, ``worker <identity>`` in the background),
            recorded in the ``turn_reconciled`` event.
    """
    gate = asyncio.Semaphore(_DESCRIBES)

    async def ask(turn_id: str) -> ReconciledTurn:
        async with gate:
            return await describe_turn(client, turn_id)

    views = await asyncio.gather(*map(ask, turn_ids))
    now = datetime.now(UTC)
    async with store.sessions.begin() as session:
        for view in views:
            if view.temporal_status not in _CLOSED:
                continue
            status = view.temporal_status
            moved = await close_turn(
                session,
                turn_id=view.turn_id,
                status=status,
                ended_at=view.closed_at,
                error=None if status == "completed" else view.detail or status,
                error_type=_ERROR_TYPES.get(status),
                payload={
                    "temporal_status": status,
                    "previous_status": "running",
                    "status": status,
                    "run_id": view.run_id,
                    "closed_at": view.closed_at.isoformat() if view.closed_at else None,
                    "detail": view.detail,
                    "by": by,
                },
                at=now,
            )
            if moved:
                view.status = status
        await mark_checked(session, turn_ids=[v.turn_id for v in views if v.status is None], at=now)
    return list(views)


def _report(views: Sequence[ReconciledTurn]) -> ReconcileReport:
    report = ReconcileReport(checked=len(views))
    for view in views:
        if view.status is not None:
            report.changed.append(view)
        elif view.temporal_status == "not_found":
            report.missing.append(view)
        elif view.temporal_status == "running":
            report.still_running += 1
    return report


async def reconcile(
    client: Client,
    store: AuditStore,
    *,
    since: datetime | None = None,
    by: str = "reconcile",
    page: int = 200,
) -> ReconcileReport:
    """Reconcile every turn whose row says ``running`` (started at or after ``since``).

    Args:
        client: the Temporal client.
        store: the audit database.
        since: only turns started at or after this time (default: all).
        by: recorded in each ``turn_reconciled`` event.
        page: turns read and described per round.
    """
    started = datetime.now(UTC)
    views: list[ReconciledTurn] = []
    while True:
        # Each checked turn gets a check time after ``started``: the next page is new turns.
        async with store.sessions() as session:
            ids = await running_turns(session, since=since, checked_before=started, limit=page)
        if not ids:
            break
        views.extend(await reconcile_turns(client, store, ids, by=by))
        if len(ids) < page:
            break
    return _report(views)


def _identity() -> str:
    return f"{os.getpid()}@{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


class BackgroundReconciler:
    """A worker's background reconciliation: bounded, and one worker at a time.

    Every ``interval_s`` the worker that holds the ``reconcile`` lease (a row of
    ``maintenance_lease``, taken over by another worker once its holder stops renewing it)
    asks Temporal about at most ``batch`` turns whose row says ``running``, started more than
    ``grace_s`` ago and not checked within the last ``grace_s``: one describe per turn.
    """

    def __init__(
        self,
        client: Client,
        store: AuditStore,
        *,
        interval_s: float = 60.0,
        grace_s: float = 300.0,
        batch: int = 100,
        holder: str | None = None,
    ) -> None:
        """Set up; nothing runs before ``run`` (or ``run_once``)."""
        self.client = client
        self.store = store
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.batch = batch
        self.holder = holder or _identity()
        self.passes = 0
        """Passes made while holding the lease (for tests and logs)."""

    @property
    def lease_s(self) -> float:
        """How long a taken lease lasts: a few intervals, so a lost holder is replaced soon."""
        return max(3 * self.interval_s, 30.0)

    async def run_once(self) -> ReconcileReport | None:
        """One pass; ``None`` when another worker holds the lease."""
        async with self.store.sessions.begin() as session:
            held = await take_lease(
                session, name=LEASE_NAME, holder=self.holder, seconds=self.lease_s
            )
        if not held:
            return None
        now = datetime.now(UTC)
        since_grace = now - timedelta(seconds=self.grace_s)
        async with self.store.sessions() as session:
            ids = await running_turns(
                session, started_before=since_grace, checked_before=since_grace, limit=self.batch
            )
        views = await reconcile_turns(self.client, self.store, ids, by=f"worker {self.holder}")
        self.passes += 1
        report = _report(views)
        for view in report.changed:
            log.info(
                "turn %r ended in Temporal as %s (%s); its row said running",
                view.turn_id,
                view.status,
                view.detail,
            )
        return report

    async def run(self) -> None:
        """Pass after pass, every ``interval_s``, until cancelled; errors are logged."""
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                try:
                    await self.run_once()
                except Exception:  # a database or Temporal outage: next pass
                    log.warning("background reconciliation failed; next pass", exc_info=True)
        finally:
            await self.release()

    async def release(self) -> None:
        """Let go of the lease (if this worker holds it), so another worker takes it at once."""
        with contextlib.suppress(Exception):
            async with self.store.sessions.begin() as session:
                await release_lease(session, name=LEASE_NAME, holder=self.holder)


@contextlib.asynccontextmanager
async def background_reconciliation(
    client: Client, store: AuditStore, settings: Settings | None = None
) -> AsyncIterator[BackgroundReconciler | None]:
    """Run background reconciliation while the block runs (unless the settings turn it off).

    The settings give the interval, grace period and batch (``TOOLTRAIL_RECONCILE_*``).
    """
    settings = settings or Settings()
    if not settings.reconcile_enabled:
        yield None
        return
    reconciler = BackgroundReconciler(
        client,
        store,
        interval_s=settings.reconcile_interval_s,
        grace_s=settings.reconcile_grace_s,
        batch=settings.reconcile_batch,
    )
    task = asyncio.create_task(reconciler.run(), name="tooltrail-reconcile")
    try:
        yield reconciler
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
