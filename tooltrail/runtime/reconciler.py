"""Reconciliation: turns that ended outside tooltrail get their true status in SQL.

A turn's workflow writes its own final status, but Temporal can end a workflow without
running its code: ``temporal workflow terminate``, an execution timeout, a cancellation or
failure no worker recorded. Such a turn's row would say ``running`` for ever. Reconciliation
asks Temporal (one ``describe`` per turn, and the close event of those that closed) and moves
the row to what Temporal reports (``completed``, ``failed``, ``cancelled``, ``terminated``,
``timed_out``), with a ``turn_reconciled`` event after the turn's last one that says what
Temporal reported. A turn Temporal does not know (its history deleted by retention, or kept
by an in-memory server that died) will never end by its own code: its row moves to ``lost``,
with a ``turn_reconciled`` event that says Temporal has no such workflow; how it ended cannot
be known any more. ``lost`` is as final as ``terminated``: reconcile against the server the
turns ran on (another server knows none of them, and every running turn would read as lost).

A turn that closed before its first write has no row at all: reconciliation also lists the
``TurnWorkflow`` executions that closed since its watermark (Temporal's visibility) and
rebuilds the trail of each one the database lacks from its history
(``tooltrail.runtime.rebuild``), a bounded number per pass, resuming where the last pass
stopped (``rebuild_watermark``).

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
from itertools import pairwise

from pydantic import BaseModel, Field
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistoryEventFilterType
from temporalio.service import RPCError, RPCStatusCode

from tooltrail.db.reconcile import (
    RebuildWatermark,
    close_turn,
    earliest_turn_start,
    load_watermark,
    mark_checked,
    record_rebuilt_turn,
    release_lease,
    running_turns,
    save_watermark,
    take_lease,
    turns_with_rows,
)
from tooltrail.db.store import AuditStore
from tooltrail.pipeline.host import Host
from tooltrail.pipeline.middleware import RedactingMiddleware
from tooltrail.runtime.rebuild import close_detail, rebuild_turn
from tooltrail.settings import Settings

__all__ = [
    "LEASE_NAME",
    "LOST",
    "BackgroundReconciler",
    "ReconcileReport",
    "ReconciledTurn",
    "background_reconciliation",
    "describe_turn",
    "host_redactors",
    "rebuild_missing_turns",
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
    "lost": "WorkflowNotFound",
}
_DESCRIBES = 8
"""Describe calls in flight at once."""
_OVERLAP = timedelta(seconds=60)
"""How far back a new window of closed turns starts before the last one ended: a close that
Temporal's visibility indexed late (it lags the history a little) is still listed."""
FIRST_PASS_LOOKBACK_S = 600.0
"""How far before now a database's first pass looks for closed turns when it has no turn of
its own yet (with turns, it looks back to the earliest)."""
_SCANS_PER_REBUILD = 20
"""Closed turns a pass lists at most, per turn it may rebuild (listing is cheap: ids only)."""
_TICK = timedelta(microseconds=1)

LOST = "lost"
"""The status of a turn Temporal does not know: it can never end by its own code."""


def temporal_status(status: WorkflowExecutionStatus | None) -> str:
    """Tooltrail's name of a Temporal execution status (``timed_out``, ``terminated``, ...)."""
    return _STATUS.get(status, "unknown") if status is not None else "unknown"


class ReconciledTurn(BaseModel):
    """What Temporal reported about one turn, and what reconciliation did with it."""

    turn_id: str
    temporal_status: str
    """``running``, ``completed``, ``failed``, ``cancelled``, ``terminated``, ``timed_out``,
    ``continued_as_new``, ``not_found`` (no such workflow: never started here, or its
    history was deleted by the namespace's retention), or ``unreadable`` (a closed turn
    with no row whose history cannot be decoded here)."""
    status: str | None = None
    """The status written to the turn's row (``lost`` when Temporal does not know it);
    ``None`` when the row was left as it was."""
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
    """Turns Temporal does not know (history deleted by retention, or an in-memory server
    that died): their rows moved to ``lost``."""
    still_running: int = 0
    """Turns that are running in Temporal too."""
    rebuilt: list[ReconciledTurn] = Field(default_factory=list)
    """Turns Temporal closed that had no row at all (they closed before their first write):
    their row and trail were rebuilt from their history, every record marked ``rebuilt``."""
    unreadable: list[ReconciledTurn] = Field(default_factory=list)
    """Closed turns with no row whose history could not be read here (the codec's keys
    missing, say): nothing was written, and the watermark moves on; ``reconcile(since=...)``
    with the keys rebuilds them."""
    complete: bool = True
    """Every closed turn up to now was looked at (False: a bounded pass stopped early; the
    next one goes on where it stopped)."""


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
    return await close_detail(client, event, status)


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
                "its history was deleted by the namespace's retention, or the server that ran "
                "it kept its state in memory and was restarted",
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
            if view.temporal_status == "not_found":
                status = LOST
            elif view.temporal_status in _CLOSED:
                status = view.temporal_status
            else:
                continue
            moved = await close_turn(
                session,
                turn_id=view.turn_id,
                status=status,
                ended_at=view.closed_at,
                error=None if status == "completed" else view.detail or status,
                error_type=_ERROR_TYPES.get(status),
                payload={
                    "temporal_status": view.temporal_status,
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


def _visibility_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _closed_turns_query(
    task_queue: str | None,
    closed_since: datetime | None,
    closed_before: datetime,
    started_since: datetime | None,
) -> str:
    query = "WorkflowType = 'TurnWorkflow' AND ExecutionStatus != 'Running'"
    if task_queue:
        quoted = task_queue.replace("\\", "\\\\").replace("'", "\\'")
        query += f" AND TaskQueue = '{quoted}'"
    if closed_since is not None:
        query += f" AND CloseTime >= '{_visibility_time(closed_since)}'"
    query += f" AND CloseTime < '{_visibility_time(closed_before)}'"
    if started_since is not None:
        query += f" AND StartTime >= '{_visibility_time(started_since)}'"
    return query


async def _rebuild_one(
    client: Client,
    store: AuditStore,
    turn_id: str,
    *,
    by: str,
    redactors: Sequence[RedactingMiddleware],
) -> ReconciledTurn | None:
    """Rebuild one turn that has no row from its latest run's history, if that run closed.

    Returns what was done, or ``None`` when there was nothing to do (its latest run still
    runs and will write its own row; a row appeared meanwhile).

    Raises:
        Exception: the history could not be read or decoded (the codec's keys missing, say).
    """
    view = await describe_turn(client, turn_id)
    if view.temporal_status not in _CLOSED or view.run_id is None:
        return None
    history = await client.get_workflow_handle(turn_id, run_id=view.run_id).fetch_history()
    rebuilt = await rebuild_turn(
        client, turn_id, view.run_id, history.events, by=by, redactors=redactors
    )
    if rebuilt is None:
        return None
    async with store.sessions.begin() as session:
        written = await record_rebuilt_turn(session, turn=rebuilt.turn, events=rebuilt.events)
    if not written:
        return None
    view.status = rebuilt.turn.status
    view.detail = rebuilt.detail
    return view


async def rebuild_missing_turns(
    client: Client,
    store: AuditStore,
    *,
    task_queue: str | None,
    by: str,
    batch: int = 100,
    settle_s: float = 0.0,
    started_since: datetime | None = None,
    redactors: Sequence[RedactingMiddleware] = (),
) -> ReconcileReport:
    """One bounded pass over the turns Temporal closed since the watermark that have no row.

    Temporal's visibility lists the closed ``TurnWorkflow`` executions of the task queue
    (newest first); those the database has no ``turn`` row for are rebuilt from their
    histories, at most ``batch`` of them, and at most ``20 * batch`` are listed. Where the
    pass stopped is kept in ``rebuild_watermark``, so the next pass goes on from there; a
    pass that got through its window moves the watermark up to the window's end (less a
    minute, for visibility's lag).

    Args:
        client: the Temporal client (with the deployment's data converter).
        store: the audit database.
        task_queue: the deployment's task queue (``None``: every turn of the namespace).
        by: who rebuilds, recorded in each rebuilt ``turn_reconciled`` record.
        batch: turns rebuilt at most.
        settle_s: only turns closed at least this long ago (a write a worker had in flight
            when Temporal ended the turn lands first).
        started_since: only turns started at or after this time; the watermark is then
            neither used nor moved (the listing starts from the beginning).
        redactors: the host's redacting layers (the trail stores texts redacted).

    Returns:
        A report with ``rebuilt``, ``unreadable`` and ``complete`` set.
    """
    report, _ = await _rebuild_pass(
        client,
        store,
        task_queue=task_queue,
        by=by,
        batch=batch,
        settle_s=settle_s,
        started_since=started_since,
        redactors=redactors,
    )
    return report


async def _rebuild_pass(
    client: Client,
    store: AuditStore,
    *,
    task_queue: str | None,
    by: str,
    batch: int,
    settle_s: float,
    started_since: datetime | None,
    redactors: Sequence[RedactingMiddleware],
) -> tuple[ReconcileReport, bool]:
    """``rebuild_missing_turns``, and whether the pass got anywhere (rebuilt or moved on)."""
    scope = {"namespace": client.namespace, "task_queue": task_queue or ""}
    now = datetime.now(UTC)
    mark = RebuildWatermark()
    if started_since is None:
        async with store.sessions() as session:
            mark = await load_watermark(session, **scope)
            if mark == RebuildWatermark():
                # A database's first pass: the turns that are its own are those since its
                # first turn, or since shortly before now for an empty one; not every turn the
                # namespace ever closed on the queue (a new database beside an old namespace,
                # a test's beside a shared server, would rebuild strangers' trails).
                first = await earliest_turn_start(session)
                since = now - timedelta(seconds=FIRST_PASS_LOOKBACK_S)
                mark = RebuildWatermark(closed_since=since if first is None else min(first, since))
    window_end = mark.window_end or now - timedelta(seconds=settle_s)
    mark = mark.model_copy(update={"window_end": window_end})
    query = _closed_turns_query(
        task_queue, mark.closed_since, mark.resume_before or window_end, started_since
    )
    scan = _SCANS_PER_REBUILD * batch
    listed: list[tuple[str, datetime | None]] = []
    more = False
    async for execution in client.list_workflows(query, page_size=min(scan, 1000)):
        if len(listed) >= scan:
            more = True
            break
        listed.append((execution.id, execution.close_time))
    async with store.sessions() as session:
        known = await turns_with_rows(session, turn_ids=[turn_id for turn_id, _ in listed])
    report = ReconcileReport()
    seen: set[str] = set()
    examined = 0
    for turn_id, _ in listed:
        if len(report.rebuilt) >= batch:
            more = True
            break
        examined += 1
        if turn_id in known or turn_id in seen:
            continue
        seen.add(turn_id)  # an older run of a turn listed already (a reset)
        try:
            view = await _rebuild_one(client, store, turn_id, by=by, redactors=redactors)
        except RPCError:
            raise
        except Exception as exc:  # a codec without its keys, a history of another converter
            report.unreadable.append(
                ReconciledTurn(
                    turn_id=turn_id,
                    temporal_status="unreadable",
                    detail=f"its history cannot be read here ({type(exc).__name__}: {exc})",
                )
            )
            continue
        if view is not None:
            report.rebuilt.append(view)
    report.complete = not more
    moved = _moved(mark, window_end, listed[:examined], more=more)
    if started_since is None:
        async with store.sessions.begin() as session:
            await save_watermark(session, **scope, mark=moved)
    return report, bool(report.rebuilt) or moved != mark


def _moved(
    mark: RebuildWatermark,
    window_end: datetime,
    examined: list[tuple[str, datetime | None]],
    *,
    more: bool,
) -> RebuildWatermark:
    """The watermark after a pass that looked at ``examined`` (newest first) of its window."""
    if not more:
        # The window is done: the next one starts where it ended (less the overlap).
        return RebuildWatermark(closed_since=window_end - _OVERLAP)
    times = [closed for _, closed in examined if closed is not None]
    if not times or any(later > earlier for earlier, later in pairwise(times)):
        # Visibility did not list them newest first: no cursor can be trusted, the next pass
        # lists the window again (the turns rebuilt meanwhile have rows and are skipped).
        return mark
    # The turns closed at the last time examined are listed again next time (ties).
    return mark.model_copy(update={"resume_before": times[-1] + _TICK})


def _report(views: Sequence[ReconciledTurn]) -> ReconcileReport:
    report = ReconcileReport(checked=len(views))
    for view in views:
        if view.temporal_status == "not_found":
            report.missing.append(view)
        elif view.status is not None:
            report.changed.append(view)
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
    task_queue: str | None = None,
    redactors: Sequence[RedactingMiddleware] = (),
) -> ReconcileReport:
    """Reconcile every turn whose row says ``running`` (started at or after ``since``).

    Then rebuild every turn Temporal closed with no row at all (``rebuild_missing_turns``):
    since the watermark, which moves on; with ``since``, every such turn started since then.

    Args:
        client: the Temporal client.
        store: the audit database.
        since: only turns started at or after this time (default: all).
        by: recorded in each ``turn_reconciled`` event.
        page: turns read and described per round (and rebuilt per pass).
        task_queue: the deployment's task queue, whose closed turns are listed (``None``:
            every turn of the namespace).
        redactors: the host's redacting layers (rebuilt trails store texts redacted).
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
    report = _report(views)
    while True:
        found, progressed = await _rebuild_pass(
            client,
            store,
            task_queue=task_queue,
            by=by,
            batch=page,
            settle_s=0.0,
            started_since=since,
            redactors=redactors,
        )
        report.rebuilt.extend(found.rebuilt)
        report.unreadable.extend(found.unreadable)
        report.complete = found.complete
        # With ``since`` there is no cursor: one bounded pass. A pass that neither rebuilt
        # nor moved on would only repeat itself.
        if found.complete or since is not None or not progressed:
            return report


def host_redactors(host: Host) -> list[RedactingMiddleware]:
    """The host's ``RedactingMiddleware`` layers: their rules apply to what the trail stores."""
    return [layer for layer in host.middleware if isinstance(layer, RedactingMiddleware)]


def _identity() -> str:
    return f"{os.getpid()}@{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


class BackgroundReconciler:
    """A worker's background reconciliation: bounded, and one worker at a time.

    Every ``interval_s`` the worker that holds the ``reconcile`` lease (a row of
    ``maintenance_lease``, taken over by another worker once its holder stops renewing it)
    asks Temporal about at most ``batch`` turns whose row says ``running``, started more than
    ``grace_s`` ago and not checked within the last ``grace_s``: one describe per turn. Then
    it rebuilds at most ``batch`` turns of its task queue that Temporal closed (``settle_s``
    ago at least) with no row at all (``rebuild_missing_turns``).
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
        task_queue: str | None = None,
        settle_s: float = 30.0,
        redactors: Sequence[RedactingMiddleware] = (),
    ) -> None:
        """Set up; nothing runs before ``run`` (or ``run_once``).

        Args:
            client: the Temporal client (with the deployment's data converter).
            store: the audit database.
            interval_s: seconds between passes.
            grace_s: a running turn is asked about once it started this long ago, then at
                most this often.
            batch: turns asked about, and turns rebuilt, per pass at most.
            holder: this worker's name on the lease (default: pid, host and a random part).
            task_queue: the deployment's task queue, whose closed turns without a row are
                rebuilt (``None``: every turn of the namespace).
            settle_s: closed turns are rebuilt once they closed this long ago: a batch write
                a worker had in flight when Temporal ended the turn lands first.
            redactors: the host's redacting layers (rebuilt trails store texts redacted).
        """
        self.client = client
        self.store = store
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.batch = batch
        self.task_queue = task_queue
        self.settle_s = settle_s
        self.redactors = list(redactors)
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
        by = f"worker {self.holder}"
        views = await reconcile_turns(self.client, self.store, ids, by=by)
        report = _report(views)
        found = await rebuild_missing_turns(
            self.client,
            self.store,
            task_queue=self.task_queue,
            by=by,
            batch=self.batch,
            settle_s=self.settle_s,
            redactors=self.redactors,
        )
        report.rebuilt, report.unreadable = found.rebuilt, found.unreadable
        report.complete = found.complete
        self.passes += 1
        for view in report.changed:
            log.info(
                "turn %r ended in Temporal as %s (%s); its row said running",
                view.turn_id,
                view.status,
                view.detail,
            )
        for view in report.missing:
            if view.status == LOST:
                log.warning(
                    "turn %r is unknown to Temporal (%s); its row said running, now lost",
                    view.turn_id,
                    view.detail,
                )
        for view in report.rebuilt:
            log.info(
                "turn %r closed in Temporal as %s (%s) with no row: rebuilt from its history",
                view.turn_id,
                view.status,
                view.detail,
            )
        for view in report.unreadable:
            log.warning("turn %r closed with no row and %s", view.turn_id, view.detail)
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
    client: Client,
    store: AuditStore,
    settings: Settings | None = None,
    *,
    task_queue: str | None = None,
    redactors: Sequence[RedactingMiddleware] = (),
) -> AsyncIterator[BackgroundReconciler | None]:
    """Run background reconciliation while the block runs (unless the settings turn it off).

    The settings give the interval, grace period, batch and settling time
    (``TOOLTRAIL_RECONCILE_*``); the task queue is the deployment's (whose closed turns
    without a row are rebuilt), the redactors the host's.
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
        settle_s=settings.reconcile_settle_s,
        task_queue=task_queue,
        redactors=redactors,
    )
    task = asyncio.create_task(reconciler.run(), name="tooltrail-reconcile")
    try:
        yield reconciler
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
