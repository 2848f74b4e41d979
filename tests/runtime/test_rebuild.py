"""Turns that closed before their first write are rebuilt from their histories (real Temporal).

A turn's records wait in its workflow for the first batch (``audit_interval_s``). Terminated,
timed out, or left by its only worker before then, the workflow runs no more code: the
audit database never hears of the turn, and only reconciliation, which lists the turns
Temporal closed, can bring it into the trail.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tests.ops.test_encrypted_ops import KEYS, running
from tests.runtime.test_crash import start_worker_process
from tests.runtime.test_reconcile import HOST, temporal_cli, until_status
from tests.support import crash_tools
from tests.support.cli_runner import run_cli
from tooltrail import RunConfig, ToolCall, Tooltrail
from tooltrail.core.wire import AuditEvent, ExecuteAttempt
from tooltrail.db.store import AuditStore
from tooltrail.runtime.reconciler import BackgroundReconciler, reconcile
from tooltrail.runtime.worker import settings_data_converter
from tooltrail.runtime.worker import worker as run_worker
from tooltrail.settings import Settings

# The first batch would be written a minute into the turn: every turn here ends before.
LATE_BATCH = RunConfig(audit_interval_s=60)


async def until_tool_runs(tt: Tooltrail, turn_id: str, tool: str) -> None:
    """Wait until an attempt of ``tool`` has started on a worker.

    Read from the history (the scheduled attempt's input names its tool), so an earlier
    call's attempt, pending for a moment on a loaded machine, does not pass for it.
    """
    handle = tt.client.get_workflow_handle(turn_id)
    for _ in range(300):
        ours: set[str] = set()
        for event in (await handle.fetch_history()).events:
            if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                continue
            attributes = event.activity_task_scheduled_event_attributes
            if attributes.activity_type.name != "tooltrail.tool.execute":
                continue
            (request,) = await tt.client.data_converter.decode(
                list(attributes.input.payloads), [ExecuteAttempt]
            )
            if request.tool_name == tool:
                ours.add(attributes.activity_id)
        pending = (await handle.describe()).raw_description.pending_activities
        if any(
            p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED and p.activity_id in ours
            for p in pending
        ):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no attempt of {tool!r} started in turn {turn_id}")


async def no_trail(tt: Tooltrail, turn_id: str, session_id: str) -> None:
    """The bug's precondition: the database has nothing of the turn."""
    assert await tt.store.turn(turn_id) is None
    assert await tt.audit(turn_id) == []
    assert await tt.turns(session_id=session_id) == []


def assert_rebuilt(events: list[AuditEvent], run_id: str) -> None:
    assert [e.seq for e in events] == list(range(len(events)))
    assert all(e.payload.get("rebuilt") is True for e in events), events
    assert {e.run_id for e in events} == {run_id}
    assert all(e.digest for e in events)


async def test_a_turn_terminated_during_its_first_call_is_rebuilt(
    stack: StackFactory, db_url: str, temporal_env: WorkflowEnvironment
) -> None:
    session_id = f"s-{uuid.uuid4()}"
    async with stack(HOST, database_url=db_url) as tt:
        turn_id = f"turn-{uuid.uuid4()}"
        await tt.start_turn(
            [ToolCall(id="w", name="wait", arguments={"seconds": 30})],
            session_id=session_id,
            turn_id=turn_id,
        )
        await until_tool_runs(tt, turn_id, "wait")
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
        await no_trail(tt, turn_id, session_id)

        report = await tt.reconcile()

        [rebuilt] = [r for r in report.rebuilt if r.turn_id == turn_id]
        description = await tt.client.get_workflow_handle(turn_id).describe()
        assert rebuilt.status == "terminated" and rebuilt.run_id == description.run_id
        assert "operator stopped it" in rebuilt.detail
        assert report.complete and report.unreadable == []
        row = await tt.store.turn(turn_id)
        assert row is not None
        assert (row.status, row.session_id, row.call_count) == ("terminated", session_id, 1)
        assert row.error_type == "WorkflowTerminated" and "operator stopped it" in (row.error or "")
        assert row.run_id == description.run_id and row.ended_at is not None
        events = await tt.audit(turn_id)
        assert [(e.kind, e.tool_call_id) for e in events] == [
            ("turn_started", None),
            ("tool_call_received", "w"),
            ("tool_pre", "w"),
            ("turn_reconciled", None),
        ]
        assert_rebuilt(events, description.run_id)
        assert events[1].payload["input"] == {"seconds": 30}
        last = events[-1].payload
        assert last["temporal_status"] == "terminated" and last["run_id"] == description.run_id
        assert [a["tool_call_id"] for a in last["unfinished_attempts"]] == ["w"]
        [listed] = await tt.turns(session_id=session_id)
        assert listed.turn_id == turn_id and listed.event_count == len(events)
        verified = await tt.verify(turn_id)
        assert verified.ok, verified.problems
        assert verified.temporal_status == "terminated"

        # Once: the next reconciliation finds it in the trail and writes nothing.
        again = await tt.reconcile()
        assert turn_id not in [r.turn_id for r in again.rebuilt + again.changed]
        assert await tt.audit(turn_id) == events


async def test_a_turn_past_its_execution_timeout_is_rebuilt_with_its_finished_calls(
    stack: StackFactory, db_url: str
) -> None:
    session_id = f"s-{uuid.uuid4()}"
    async with stack(HOST, database_url=db_url) as tt:
        handle = await tt.start_turn(
            [
                ToolCall(id="e", name="echo", arguments={"text": "said before"}),
                ToolCall(id="w", name="wait", arguments={"seconds": 30}),
            ],
            session_id=session_id,
            config=LATE_BATCH,
            execution_timeout=timedelta(seconds=3),
        )
        turn_id = handle.turn_id
        await until_status(tt, turn_id, WorkflowExecutionStatus.TIMED_OUT)
        await no_trail(tt, turn_id, session_id)

        report = await tt.reconcile()

        assert [r.status for r in report.rebuilt if r.turn_id == turn_id] == ["timed_out"]
        row = await tt.store.turn(turn_id)
        assert row is not None and row.status == "timed_out"
        assert row.error_type == "WorkflowTimedOut" and row.call_count == 2
        events = await tt.audit(turn_id)
        assert [(e.kind, e.tool_call_id) for e in events] == [
            ("turn_started", None),
            ("tool_call_received", "e"),
            ("tool_call_received", "w"),
            ("tool_pre", "e"),
            ("tool_post", "e"),
            ("tool_pre", "w"),
            ("turn_reconciled", None),
        ]
        assert_rebuilt(events, row.run_id)
        post = events[4]
        assert post.payload["output"] == "said before" and post.payload["is_error"] is False
        assert post.payload["input"] == {"text": "said before"}
        assert post.attempt == 0 and post.temporal_attempt == 1 and post.worker
        verified = await tt.verify(turn_id)
        assert verified.ok, verified.problems
        assert verified.attempts_checked == 1


async def test_a_trail_edited_after_its_rebuild_fails_verify(
    stack: StackFactory, sqlite_url: str
) -> None:
    # Rebuilt records are chained like any other: an edit in SQL is caught.
    async with stack(HOST, database_url=sqlite_url) as tt:
        handle = await tt.start_turn(
            [
                ToolCall(id="e", name="echo", arguments={"text": "said before"}),
                ToolCall(id="w", name="wait", arguments={"seconds": 30}),
            ],
            session_id=f"s-{uuid.uuid4()}",
            config=LATE_BATCH,
        )
        await until_tool_runs(tt, handle.turn_id, "wait")
        await handle.workflow_handle.terminate("test")
        await until_status(tt, handle.turn_id, WorkflowExecutionStatus.TERMINATED)
        await tt.reconcile()
        async with tt.store.engine.begin() as conn:
            await conn.exec_driver_sql(
                "UPDATE audit_event SET payload = replace(payload, 'said before', 'said after') "
                "WHERE turn_id = ? AND kind = 'tool_post'",
                (handle.turn_id,),
            )
        verified = await tt.verify(handle.turn_id)
        assert {p.kind for p in verified.problems} >= {"output_mismatch", "chain_broken"}


@pytest.mark.crash
async def test_a_turn_whose_only_worker_died_is_rebuilt(
    temporal_env: WorkflowEnvironment,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The worker process is SIGKILLed in its second call and no worker ever comes back:
    # the turn ends at its execution timeout, and nothing of it reached the database.
    monkeypatch.setenv("TOOLTRAIL_CRASH_DIR", str(tmp_path))
    address = temporal_env.client.service_client.config.target_host
    task_queue = f"crash-{uuid.uuid4()}"
    store = AuditStore(sqlite_url)
    tt = Tooltrail(temporal_env.client, crash_tools.host, task_queue=task_queue, store=store)
    session_id = f"s-{uuid.uuid4()}"
    try:
        doomed = await start_worker_process(address, task_queue, sqlite_url)
        handle = await tt.start_turn(
            [ToolCall("c1", "echo", {"text": "before"}), ToolCall("c2", "fragile", {})],
            session_id=session_id,
            config=RunConfig(heartbeat_timeout_s=2, audit_interval_s=60),
            execution_timeout=timedelta(seconds=6),
        )
        assert await asyncio.wait_for(doomed.wait(), timeout=60) == -9
        await until_status(tt, handle.turn_id, WorkflowExecutionStatus.TIMED_OUT)
        await no_trail(tt, handle.turn_id, session_id)

        report = await tt.reconcile()

        assert [r.status for r in report.rebuilt] == ["timed_out"]
        events = await tt.audit(handle.turn_id)
        assert [(e.kind, e.tool_call_id) for e in events] == [
            ("turn_started", None),
            ("tool_call_received", "c1"),
            ("tool_call_received", "c2"),
            ("tool_pre", "c1"),
            ("tool_post", "c1"),
            ("tool_pre", "c2"),
            ("turn_reconciled", None),
        ]
        assert_rebuilt(events, events[0].run_id or "")
        assert events[4].payload["output"] == "before"
        assert [a["tool_call_id"] for a in events[-1].payload["unfinished_attempts"]] == ["c2"]
        verified = await tt.verify(handle.turn_id)
        assert verified.ok, verified.problems
    finally:
        await store.close()


async def test_a_rebuild_with_the_codec_on(
    temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    secret = f"token-{uuid.uuid4().hex}"
    converter = settings_data_converter(Settings(codec_keys=KEYS))
    async with running(temporal_env, converter, sqlite_url, tmp_path, host=HOST) as tt:
        handle = await tt.start_turn(
            [
                ToolCall(id="e", name="echo", arguments={"text": secret}),
                ToolCall(id="w", name="wait", arguments={"seconds": 30}),
            ],
            session_id=f"s-{uuid.uuid4()}",
            config=LATE_BATCH,
        )
        await until_tool_runs(tt, handle.turn_id, "wait")
        await handle.workflow_handle.terminate(reason="stopped with the codec on")
        await until_status(tt, handle.turn_id, WorkflowExecutionStatus.TERMINATED)

        # A process without the keys cannot read the history: nothing is written, it says so.
        plain = await Client.connect(
            temporal_env.client.service_client.config.target_host,
            namespace=temporal_env.client.namespace,
        )
        blind = await reconcile(plain, tt.store, task_queue=tt.task_queue)
        assert [u.turn_id for u in blind.unreadable] == [handle.turn_id]
        assert blind.rebuilt == [] and await tt.store.turn(handle.turn_id) is None

        # With the keys (``since``: the watermark moved past it), the trail is rebuilt.
        report = await tt.reconcile(since=datetime.now(UTC) - timedelta(hours=1))
        assert [r.turn_id for r in report.rebuilt] == [handle.turn_id]
        events = await tt.audit(handle.turn_id)
        [post] = [e for e in events if e.kind == "tool_post"]
        assert post.payload["output"] == secret
        assert "stopped with the codec on" in events[-1].payload["detail"]
        verified = await tt.verify(handle.turn_id)
        assert verified.ok, verified.problems


async def test_cli_reconcile_rebuilds_and_audit_show_marks_rebuilt_records(
    stack: StackFactory, sqlite_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    address = temporal_env.client.service_client.config.target_host
    async with stack(HOST, database_url=sqlite_url) as tt:
        turn_id = await terminated_without_a_row(tt)
        where = ["--temporal-address", address, "--database-url", sqlite_url]
        args = ["audit", "reconcile", "--task-queue", tt.task_queue, *where]
        done = await asyncio.to_thread(run_cli, [*args, "--json"], tmp_path)
        assert done.returncode == 0, done.stderr
        rebuilt = json.loads(done.stdout)["rebuilt"]
        assert [(r["turn_id"], r["status"]) for r in rebuilt] == [(turn_id, "terminated")]
        # Text output: rebuilt once, nothing left to do.
        done = await asyncio.to_thread(run_cli, args, tmp_path)
        assert done.returncode == 0, done.stderr
        assert "0 closed turns with no row rebuilt" in done.stdout

        args = ["audit", "show", turn_id, "--database-url", sqlite_url]
        done = await asyncio.to_thread(run_cli, args, tmp_path)
        assert done.returncode == 0, done.stderr
        assert "4 of 4 records rebuilt from Temporal's history" in done.stdout
        assert done.stdout.count("(rebuilt)") == 4, done.stdout


async def terminated_without_a_row(tt: Tooltrail) -> str:
    """A turn terminated during its first call, before any write."""
    handle = await tt.start_turn(
        [ToolCall(id="w", name="wait", arguments={"seconds": 30})],
        session_id=f"s-{uuid.uuid4()}",
        config=LATE_BATCH,
    )
    await until_tool_runs(tt, handle.turn_id, "wait")
    await handle.workflow_handle.terminate(reason="test")
    await until_status(tt, handle.turn_id, WorkflowExecutionStatus.TERMINATED)
    return handle.turn_id


async def test_background_passes_are_bounded_and_resume_where_they_stopped(
    stack: StackFactory, db_url: str
) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        turns = [await terminated_without_a_row(tt) for _ in range(3)]
        reconciler = BackgroundReconciler(
            tt.client, tt.store, batch=1, settle_s=0, grace_s=0, task_queue=tt.task_queue
        )
        try:
            done: list[str] = []
            for _ in range(3):
                report = await reconciler.run_once()
                assert report is not None and len(report.rebuilt) == 1
                done += [r.turn_id for r in report.rebuilt]
            # Newest first, each once; the last pass found the window empty below its cursor.
            assert done == turns[::-1]
            report = await reconciler.run_once()
            assert report is not None and report.rebuilt == [] and report.complete
            for turn_id in turns:
                row = await tt.store.turn(turn_id)
                assert row is not None and row.status == "terminated"
                assert (await tt.audit(turn_id))[-1].payload["by"].startswith("worker ")
            # A later turn is found by the next window (the watermark moved up, not past it).
            later = await terminated_without_a_row(tt)
            report = await reconciler.run_once()
            assert report is not None and [r.turn_id for r in report.rebuilt] == [later]
        finally:
            # The lease is the database's: other tests' reconcilers share it.
            await reconciler.release()


async def test_a_worker_rebuilds_in_the_background(
    temporal_env: WorkflowEnvironment, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As `tooltrail worker` runs it: its own task queue's turns, after the settling time.
    monkeypatch.setenv("TOOLTRAIL_RECONCILE_INTERVAL_S", "0.2")
    monkeypatch.setenv("TOOLTRAIL_RECONCILE_SETTLE_S", "1")
    address = temporal_env.client.service_client.config.target_host
    task_queue = f"tq-{uuid.uuid4()}"
    store = AuditStore(sqlite_url)
    tt = Tooltrail(temporal_env.client, HOST, task_queue=task_queue, store=store)
    try:
        async with run_worker(
            HOST,
            temporal_address=address,
            namespace=temporal_env.client.namespace,
            task_queue=task_queue,
            database_url=sqlite_url,
        ):
            turn_id = await terminated_without_a_row(tt)
            for _ in range(200):
                row = await tt.store.turn(turn_id)
                if row is not None:
                    break
                await asyncio.sleep(0.1)
        assert row is not None and row.status == "terminated"
        assert all(e.payload.get("rebuilt") for e in await tt.audit(turn_id))
    finally:
        await store.close()
