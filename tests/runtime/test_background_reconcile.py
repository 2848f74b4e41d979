"""Background reconciliation in workers: bounded, one worker at a time, on SQLite and PG."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import delete, update
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tests.runtime.test_reconcile import HOST, running_turn, until_status
from tooltrail import Tooltrail
from tooltrail.db.orm import MaintenanceLeaseRow
from tooltrail.db.store import AuditStore
from tooltrail.runtime.reconciler import (
    LEASE_NAME,
    BackgroundReconciler,
    background_reconciliation,
)
from tooltrail.runtime.worker import worker as run_worker
from tooltrail.settings import Settings


async def until_row(tt: Tooltrail, turn_id: str, status: str, timeout_s: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        row = await tt.store.turn(turn_id)
        if row is not None and row.status == status:
            return
        await asyncio.sleep(0.1)
    row = await tt.store.turn(turn_id)
    raise AssertionError(f"{turn_id} is {row.status if row else None}, not {status}")


async def test_the_workers_background_task_fixes_terminated_and_timed_out_turns(
    temporal_env: WorkflowEnvironment, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker as `tooltrail worker` runs it, with a short interval and no grace.
    monkeypatch.setenv("TOOLTRAIL_RECONCILE_INTERVAL_S", "0.2")
    monkeypatch.setenv("TOOLTRAIL_RECONCILE_GRACE_S", "0")
    address = temporal_env.client.service_client.config.target_host
    task_queue = f"tq-{uuid.uuid4()}"
    store = AuditStore(db_url)
    tt = Tooltrail(temporal_env.client, HOST, task_queue=task_queue, store=store)
    try:
        async with run_worker(
            HOST,
            temporal_address=address,
            namespace=temporal_env.client.namespace,
            task_queue=task_queue,
            database_url=db_url,
        ):
            terminated = await running_turn(tt)
            timed = await running_turn(tt, execution_timeout=timedelta(seconds=2))
            await tt.get_turn(terminated).workflow_handle.terminate("background test")
            await until_status(tt, timed, WorkflowExecutionStatus.TIMED_OUT)
            await until_row(tt, terminated, "terminated")
            await until_row(tt, timed, "timed_out")
        for turn_id, status in ((terminated, "terminated"), (timed, "timed_out")):
            last = (await tt.audit(turn_id))[-1]
            assert last.kind == "turn_reconciled"
            assert last.payload["temporal_status"] == status
            assert last.payload["by"].startswith("worker ")
        # On its way out the worker let go of the lease: the next worker need not wait.
        async with store.sessions() as session:
            lease = await session.get(MaintenanceLeaseRow, LEASE_NAME)
        assert lease is not None
        expires = lease.expires_at
        assert (expires if expires.tzinfo else expires.replace(tzinfo=UTC)) < datetime.now(UTC)
    finally:
        await store.close()


async def test_one_worker_at_a_time_bounded_by_grace_and_batch(
    stack: StackFactory, db_url: str
) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        await tt.reconcile()  # whatever earlier tests left running in this database
        first = await running_turn(tt)
        second = await running_turn(tt)
        for turn_id in (first, second):
            await tt.get_turn(turn_id).workflow_handle.terminate("bounded test")
            await until_status(tt, turn_id, WorkflowExecutionStatus.TERMINATED)

        one = BackgroundReconciler(tt.client, tt.store, interval_s=0.1, grace_s=0, batch=1)
        other = BackgroundReconciler(tt.client, tt.store, interval_s=0.1, grace_s=0, batch=1)
        patient = BackgroundReconciler(tt.client, tt.store, interval_s=0.1, grace_s=3600)

        # The grace period: turns younger than it are not even described.
        report = await patient.run_once()
        assert report is not None and report.checked == 0
        await patient.release()

        # The batch: one describe per pass at most, the oldest turn first.
        report = await one.run_once()
        assert report is not None and report.checked == 1
        assert [c.turn_id for c in report.changed] == [first]
        # The lease: another worker's pass does nothing while the first holds it.
        assert await other.run_once() is None
        # A holder lost with its worker: once its lease expires another takes over.
        async with tt.store.sessions.begin() as session:
            await session.execute(
                update(MaintenanceLeaseRow)
                .where(MaintenanceLeaseRow.name == LEASE_NAME)
                .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
            )
        report = await other.run_once()
        assert report is not None and [c.turn_id for c in report.changed] == [second]
        assert await one.run_once() is None
        await other.release()
        for turn_id in (first, second):
            row = await tt.store.turn(turn_id)
            assert row is not None and row.status == "terminated"


async def test_a_checked_running_turn_waits_its_grace_before_the_next_describe(
    stack: StackFactory, db_url: str
) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        await tt.reconcile()
        alive = await running_turn(tt)
        await asyncio.sleep(0.3)
        reconciler = BackgroundReconciler(tt.client, tt.store, interval_s=0.1, grace_s=0.2)
        report = await reconciler.run_once()
        assert report is not None and report.still_running >= 1
        # Checked just now: within its grace it is not asked about again.
        reconciler.grace_s = 60
        report = await reconciler.run_once()
        assert report is not None and report.checked == 0
        await reconciler.release()
        await tt.get_turn(alive).workflow_handle.terminate("test over")


async def test_the_off_switch(db_url: str, temporal_env: WorkflowEnvironment) -> None:
    store = AuditStore(db_url)
    try:
        async with background_reconciliation(
            temporal_env.client, store, Settings(reconcile_enabled=False)
        ) as running:
            assert running is None
        async with background_reconciliation(
            temporal_env.client, store, Settings(reconcile_interval_s=30, reconcile_batch=7)
        ) as running:
            assert running is not None
            assert (running.interval_s, running.grace_s, running.batch) == (30, 300, 7)
    finally:
        await store.close()


async def test_two_workers_racing_for_the_lease_one_wins(stack: StackFactory, db_url: str) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        workers = [
            BackgroundReconciler(tt.client, tt.store, interval_s=0.1, grace_s=3600)
            for _ in range(4)
        ]
        async with tt.store.sessions.begin() as session:
            await session.execute(
                delete(MaintenanceLeaseRow).where(MaintenanceLeaseRow.name == LEASE_NAME)
            )
        passes = await asyncio.gather(*(worker.run_once() for worker in workers))
        assert sum(report is not None for report in passes) == 1
        # The winner renews; the others still find it held.
        winner = next(w for w, r in zip(workers, passes, strict=True) if r is not None)
        assert await winner.run_once() is not None
        assert all([await w.run_once() is None for w in workers if w is not winner])
        await winner.release()
