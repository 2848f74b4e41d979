"""Two worker processes on one task queue; the one running the current call is SIGKILLed.

Each tool body logs its worker's pid, so the test kills exactly the process that runs the
call. Temporal notices the lost heartbeat and hands the same attempt to the surviving
worker, which also takes the workflow over (replaying its history) and finishes the turn.
The audit trail must hold every event exactly once.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.faults import fault_tools
from tests.faults.fault_tools import FAULT_DIR_ENV, BodyRun
from tests.faults.history import activity_attempts, assert_exactly_once
from tests.faults.workers import WorkerProcess, start_worker, wait_until
from tooltrail import RunConfig, ToolCall, Tooltrail
from tooltrail.core.wire import TOOL_EXECUTE
from tooltrail.db.store import AuditStore

pytestmark = [pytest.mark.crash, pytest.mark.timeout(150)]

CALLS = 5
BODY_S = 1.0
KILLED_CALL = "c2"


async def test_the_other_worker_finishes_the_turn(
    temporal_env: WorkflowEnvironment,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    # Two worker processes on one SQLite file: refused unless the deployment says so.
    monkeypatch.setenv("TOOLTRAIL_SQLITE_SHARED", "true")
    address = temporal_env.client.service_client.config.target_host
    task_queue = f"two-workers-{uuid.uuid4()}"
    calls = [ToolCall(f"c{i}", "slow", {"label": f"c{i}", "seconds": BODY_S}) for i in range(CALLS)]
    store = AuditStore(sqlite_url)
    tt = Tooltrail(temporal_env.client, fault_tools.host, task_queue=task_queue, store=store)
    workers: list[WorkerProcess] = []
    try:
        for name in ("w1", "w2"):
            workers.append(await start_worker(address, task_queue, sqlite_url, tmp_path, name=name))
        by_pid = {w.pid: w for w in workers}
        handle = await tt.start_turn(
            calls, session_id=f"two-workers-{uuid.uuid4()}", config=RunConfig(heartbeat_timeout_s=2)
        )

        async def running_killed_call() -> BodyRun | None:
            for run in fault_tools.runs("slow"):
                if run.phase == "start" and run.label == KILLED_CALL:
                    return run
            return None

        running = await wait_until(running_killed_call, timeout_s=60, what=KILLED_CALL)
        # Only ever a process this test started.
        assert running.pid in by_pid, (running.pid, list(by_pid))
        doomed = by_pid[running.pid]
        survivor = next(w for w in workers if w is not doomed)
        assert await doomed.kill() == -9
        turn = await asyncio.wait_for(handle.result(), timeout=90)
        events = await tt.audit(turn.turn_id)
        record = await tt.store.turn(turn.turn_id)
        history = await handle.workflow_handle.fetch_history()
        survivor_alive = survivor.alive
    finally:
        for worker in workers:
            await worker.kill()
        await store.close()

    runs = fault_tools.runs("slow")
    killed_runs = [(r.phase, r.label) for r in runs if r.pid == doomed.pid]
    print(
        f"killed {doomed.name} (pid {doomed.pid}) in {KILLED_CALL}; its body runs {killed_runs}; "
        f"tool attempts per activity {activity_attempts(history, TOOL_EXECUTE)}"
    )
    assert survivor_alive, survivor.log_tail()
    assert [r.output for r in turn.results] == [f"c{i} done" for i in range(CALLS)]
    assert not any(r.is_error for r in turn.results)
    # The killed body never finished; the survivor ran it again to the end.
    assert ("start", KILLED_CALL) in killed_runs
    assert ("end", KILLED_CALL) not in killed_runs
    assert [(r.phase, r.pid) for r in runs if r.label == KILLED_CALL] == [
        ("start", doomed.pid),
        ("start", survivor.pid),
        ("end", survivor.pid),
    ]
    # Every later call ran once, on the survivor (the only worker left).
    later = [f"c{i}" for i in range(int(KILLED_CALL[1:]) + 1, CALLS)]
    assert [(r.label, r.pid) for r in runs if r.label in later and r.phase == "start"] == [
        (label, survivor.pid) for label in later
    ]
    # Temporal retried the killed attempt as attempt 2 of the same activity.
    assert 2 in activity_attempts(history, TOOL_EXECUTE)
    assert_exactly_once(events, [c.id for c in calls])
    assert record is not None
    assert record.status == "completed"
