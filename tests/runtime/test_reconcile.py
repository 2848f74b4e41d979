"""Reconciliation: turns closed outside tooltrail get their true status (real Temporal, SQL).

A turn is terminated with the Temporal CLI or runs into its execution timeout while a tool
body is still running: the workflow's code never runs again, so its row says ``running``
until reconciliation asks Temporal. A turn Temporal does not know at all (retention, or an
in-memory server that died) becomes ``lost``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tests.faults.fault_tools import FAULT_DIR_ENV
from tests.faults.workers import start_worker, wait_until
from tests.support.cli_runner import run_cli
from tooltrail import Host, RunConfig, ToolCall, Tooltrail, tool
from tooltrail.db.orm import TurnRow
from tooltrail.db.store import AuditStore
from tooltrail.runtime.embedded import find_binary, start_dev_server

WAIT_S = 120.0


@tool
async def wait(seconds: float) -> str:
    """Sleep for ``seconds`` (a body still running when Temporal ends the turn)."""
    await asyncio.sleep(seconds)
    return "woke"


@tool
def echo(text: str) -> str:
    """Return the text."""
    return text


HOST = Host([wait, echo])
# Every event batch is written before the next activity: the turn's row exists (running)
# while its tool body runs.
EAGER = RunConfig(audit_interval_s=0)


async def running_turn(tt: Tooltrail, *, execution_timeout: timedelta | None = None) -> str:
    """Start a turn whose tool waits, and return its id once its row says ``running``."""
    turn_id = f"turn-{uuid.uuid4()}"
    await tt.start_turn(
        [ToolCall(id="w", name="wait", arguments={"seconds": WAIT_S})],
        session_id=f"s-{uuid.uuid4()}",
        config=EAGER,
        turn_id=turn_id,
        execution_timeout=execution_timeout,
    )
    for _ in range(200):
        row = await tt.store.turn(turn_id)
        events = await tt.store.events(turn_id)
        if row is not None and any(e.kind == "tool_pre" for e in events):
            assert row.status == "running"
            return turn_id
        await asyncio.sleep(0.05)
    raise AssertionError(f"turn {turn_id} never wrote its running row")


def temporal_cli(env: WorkflowEnvironment, *args: str) -> None:
    """Run the Temporal CLI against the test server, as an operator would."""
    binary = find_binary("temporal")
    address = env.client.service_client.config.target_host
    subprocess.run(
        [binary, *args, "--address", address, "--namespace", env.client.namespace],
        check=True,
        capture_output=True,
        timeout=60,
    )


async def until_status(tt: Tooltrail, turn_id: str, status: WorkflowExecutionStatus) -> None:
    for _ in range(300):
        if (await tt.client.get_workflow_handle(turn_id).describe()).status == status:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{turn_id} never reached {status}")


async def test_a_terminated_turn_is_reconciled_to_terminated(
    stack: StackFactory, db_url: str, temporal_env: WorkflowEnvironment
) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        turn_id = await running_turn(tt)
        last_seq = (await tt.audit(turn_id))[-1].seq
        temporal_cli(
            temporal_env,
            "workflow",
            "terminate",
            "--workflow-id",
            turn_id,
            "--reason",
            "operator stopped it",
        )
        await until_status(tt, turn_id, WorkflowExecutionStatus.TERMINATED)
        # Temporal ran none of the turn's code: its row still says running.
        row = await tt.store.turn(turn_id)
        assert row is not None and row.status == "running"

        report = await tt.reconcile()

        [changed] = [c for c in report.changed if c.turn_id == turn_id]
        assert changed.status == "terminated" and changed.temporal_status == "terminated"
        assert "operator stopped it" in changed.detail
        row = await tt.store.turn(turn_id)
        assert row is not None
        assert row.status == "terminated"
        assert row.error_type == "WorkflowTerminated"
        assert row.error is not None and "operator stopped it" in row.error
        assert row.ended_at is not None
        events = await tt.audit(turn_id)
        last = events[-1]
        assert last.kind == "turn_reconciled" and last.seq == last_seq + 1
        assert last.payload["temporal_status"] == "terminated"
        assert last.payload["previous_status"] == "running"
        assert "operator stopped it" in last.payload["detail"]
        description = await tt.client.get_workflow_handle(turn_id).describe()
        assert last.payload["run_id"] == description.run_id

        # Reconciled once: a second pass finds nothing to do and writes nothing.
        again = await tt.reconcile()
        assert turn_id not in [c.turn_id for c in again.changed]
        assert len(await tt.audit(turn_id)) == len(events)


async def test_a_timed_out_turn_is_reconciled_and_a_running_one_is_left_alone(
    stack: StackFactory, db_url: str
) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        timed = await running_turn(tt, execution_timeout=timedelta(seconds=2))
        alive = await running_turn(tt)
        await until_status(tt, timed, WorkflowExecutionStatus.TIMED_OUT)

        report = await tt.reconcile()

        assert [c.status for c in report.changed if c.turn_id == timed] == ["timed_out"]
        assert alive not in [c.turn_id for c in report.changed + report.missing]
        assert report.still_running >= 1
        row = await tt.store.turn(timed)
        assert row is not None and row.status == "timed_out"
        assert row.error_type == "WorkflowTimedOut"
        assert (await tt.audit(timed))[-1].payload["temporal_status"] == "timed_out"
        alive_row = await tt.store.turn(alive)
        assert alive_row is not None and alive_row.status == "running"
        assert all(e.kind != "turn_reconciled" for e in await tt.audit(alive))
        await tt.get_turn(alive).workflow_handle.terminate("test over")


async def test_a_turn_unknown_to_temporal_is_marked_lost(stack: StackFactory, db_url: str) -> None:
    # A row whose workflow Temporal no longer has: its history was deleted by retention. It
    # was left ``running`` for ever; it is now ``lost``, and its trail says why.
    turn_id = f"turn-gone-{uuid.uuid4()}"
    async with stack(HOST, database_url=db_url) as tt:
        async with tt.store.sessions.begin() as session:
            session.add(
                TurnRow(
                    turn_id=turn_id,
                    session_id="s",
                    status="running",
                    started_at=datetime.now(UTC) - timedelta(days=40),
                    call_count=1,
                )
            )
        # ``since`` leaves older turns out.
        later = await tt.reconcile(since=datetime.now(UTC) - timedelta(days=1))
        assert turn_id not in [m.turn_id for m in later.missing]
        row = await tt.store.turn(turn_id)
        assert row is not None and row.status == "running"

        since = datetime.now(UTC) - timedelta(days=41)
        report = await tt.reconcile(since=since)
        [missing] = [m for m in report.missing if m.turn_id == turn_id]
        assert (missing.temporal_status, missing.status) == ("not_found", "lost")
        assert "retention" in missing.detail
        assert turn_id not in [c.turn_id for c in report.changed]
        row = await tt.store.turn(turn_id)
        assert row is not None and row.status == "lost"
        assert row.error_type == "WorkflowNotFound" and row.ended_at is not None
        [event] = await tt.audit(turn_id)
        assert (event.kind, event.seq) == ("turn_reconciled", 0)
        assert event.payload["temporal_status"] == "not_found"
        assert event.payload["status"] == "lost"
        # Reconciled once: a lost turn is not asked about again.
        again = await tt.reconcile(since=since)
        assert turn_id not in [m.turn_id for m in again.missing]
        assert len(await tt.audit(turn_id)) == 1


async def test_a_completed_turn_is_not_touched(stack: StackFactory, db_url: str) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        turn = await tt.run_turn(
            [ToolCall(id="e", name="echo", arguments={"text": "hi"})], session_id="s"
        )
        before = await tt.audit(turn.turn_id)
        report = await tt.reconcile()
        assert turn.turn_id not in [c.turn_id for c in report.changed]
        assert await tt.audit(turn.turn_id) == before
        row = await tt.store.turn(turn.turn_id)
        assert row is not None and row.status == "completed"


async def test_cli_audit_reconcile(
    stack: StackFactory, db_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    address = temporal_env.client.service_client.config.target_host
    async with stack(HOST, database_url=db_url) as tt:
        turn_id = await running_turn(tt)
        await tt.get_turn(turn_id).workflow_handle.terminate("cli test")
        await until_status(tt, turn_id, WorkflowExecutionStatus.TERMINATED)
        args = ["audit", "reconcile", "--temporal-address", address, "--database-url", db_url]
        done = await asyncio.to_thread(run_cli, [*args, "--json"], tmp_path)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert [c["status"] for c in report["changed"] if c["turn_id"] == turn_id] == ["terminated"]
        row = await tt.store.turn(turn_id)
        assert row is not None and row.status == "terminated"
        # Text output: nothing left to do for this turn.
        done = await asyncio.to_thread(run_cli, args, tmp_path)
        assert done.returncode == 0, done.stderr
        assert "running turns checked" in done.stdout
        assert turn_id not in done.stdout


@pytest.mark.parametrize("bad", ["yesterday", "2026-13-01"])
def test_cli_reconcile_refuses_a_bad_since(bad: str, tmp_path: Path) -> None:
    done = run_cli(["audit", "reconcile", "--since", bad], tmp_path)
    assert done.returncode == 2
    assert "not an ISO date or time" in done.stderr


@pytest.mark.crash
async def test_a_turn_whose_in_memory_server_died_is_marked_lost(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The embedded server keeps its state in memory: a turn running when it dies is gone
    # with it, and a server started again knows nothing of it.
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    task_queue = f"lost-{uuid.uuid4()}"
    turn_id = f"turn-{uuid.uuid4()}"
    first = await start_dev_server()
    store = AuditStore(db_url)
    try:
        worker = await start_worker(
            first.client.service_client.config.target_host, task_queue, db_url, tmp_path
        )
        try:
            tt = Tooltrail(first.client, task_queue=task_queue, store=store)
            await tt.start_turn(
                [ToolCall("c1", "slow", {"label": "lost", "seconds": WAIT_S})],
                session_id=f"s-{turn_id}",
                config=EAGER,
                turn_id=turn_id,
            )

            async def body_running() -> bool | None:
                events = await store.events(turn_id)
                return True if any(e.kind == "tool_pre" for e in events) else None

            await wait_until(body_running, timeout_s=60, what="the tool's body")
        finally:
            await worker.kill()
            await first.shutdown()
        row = await store.turn(turn_id)
        assert row is not None and row.status == "running"
        last = (await store.events(turn_id))[-1]

        second = await start_dev_server()
        try:
            report = await Tooltrail(second.client, task_queue=task_queue, store=store).reconcile()
        finally:
            await second.shutdown()
        [missing] = [m for m in report.missing if m.turn_id == turn_id]
        assert missing.status == "lost"
        row = await store.turn(turn_id)
        assert row is not None and row.status == "lost"
        assert row.error is not None and "in memory and was restarted" in row.error
        events = await store.events(turn_id)
        reconciled = events[-1]
        # After the turn's last event, in the run that wrote it.
        assert reconciled.kind == "turn_reconciled" and reconciled.seq == last.seq + 1
        assert reconciled.run_id == last.run_id == row.run_id
        assert reconciled.payload["previous_status"] == "running"
    finally:
        await store.close()
    # ``audit list`` no longer shows it running.
    listed = await asyncio.to_thread(
        run_cli, ["audit", "list", "--database-url", db_url, "--json"], tmp_path
    )
    assert listed.returncode == 0, listed.stderr
    assert [t["status"] for t in json.loads(listed.stdout) if t["turn_id"] == turn_id] == ["lost"]
    running = await asyncio.to_thread(
        run_cli,
        ["audit", "list", "--status", "running", "--database-url", db_url, "--json"],
        tmp_path,
    )
    assert turn_id not in [t["turn_id"] for t in json.loads(running.stdout)]
