"""The Temporal server goes down in the middle of a tool call and comes back.

The test runs a file-backed dev server of its own (SQLite persistence), a worker in a
subprocess, and a turn of slow calls. The server is shut down while a call's body runs, stays
down longer than the body, and is started again on the same port and database file. The
same workflow execution must then finish the turn (the history survived), and the audit
trail must hold every event exactly once, whether or not Temporal re-ran the interrupted
attempt.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.faults import fault_tools
from tests.faults.fault_tools import FAULT_DIR_ENV
from tests.faults.history import activity_attempts, assert_exactly_once
from tests.faults.pg import free_port
from tests.faults.workers import WorkerProcess, start_worker, wait_until
from tooltrail import RunConfig, ToolCall, Tooltrail, TurnResult
from tooltrail.core.wire import TOOL_EXECUTE
from tooltrail.db.store import AuditStore
from tooltrail.runtime.embedded import start_dev_server
from tooltrail.runtime.worker import connect_client

pytestmark = [pytest.mark.crash, pytest.mark.timeout(150)]

CALLS = 6
BODY_S = 0.5
OUTAGE_S = 3.0
KILLED_CALL = "c2"
MAX_WORKER_RESTARTS = 3


async def result_with_a_live_worker(
    handle_result: asyncio.Future[TurnResult],
    workers: list[WorkerProcess],
    restart: Callable[[], Awaitable[WorkerProcess]],
    timeout_s: float,
) -> tuple[TurnResult, int]:
    """Wait for the turn; start a new worker whenever the current one has died (bounded)."""
    restarts = 0
    deadline = time.monotonic() + timeout_s
    while not handle_result.done():
        if time.monotonic() > deadline:
            handle_result.cancel()
            raise TimeoutError(f"the turn did not finish within {timeout_s:.0f} s")
        if not workers[-1].alive:
            assert restarts < MAX_WORKER_RESTARTS, f"worker died {restarts + 1} times"
            restarts += 1
            workers.append(await restart())
        await asyncio.wait([handle_result], timeout=0.5)
    return handle_result.result(), restarts


async def test_turn_survives_a_server_restart(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    port = free_port()
    address = f"127.0.0.1:{port}"
    server_db = str(tmp_path / "temporal.db")
    task_queue = f"restart-{uuid.uuid4()}"
    calls = [ToolCall(f"c{i}", "slow", {"label": f"c{i}", "seconds": BODY_S}) for i in range(CALLS)]
    envs: list[WorkflowEnvironment] = [await start_dev_server(port=port, db_filename=server_db)]
    workers: list[WorkerProcess] = []
    store = AuditStore(sqlite_url)

    async def new_worker() -> WorkerProcess:
        return await start_worker(address, task_queue, sqlite_url, tmp_path, name="restart")

    try:
        workers.append(await new_worker())
        client = await connect_client(address)
        tt = Tooltrail(client, fault_tools.host, task_queue=task_queue, store=store)
        handle = await tt.start_turn(
            calls, session_id=f"restart-{uuid.uuid4()}", config=RunConfig(heartbeat_timeout_s=2)
        )
        run_id = (await handle.workflow_handle.describe()).run_id

        async def killed_call_running() -> bool | None:
            started = {r.label for r in fault_tools.runs("slow") if r.phase == "start"}
            return True if KILLED_CALL in started else None

        await wait_until(killed_call_running, timeout_s=60, what=f"call {KILLED_CALL}")
        await envs.pop().shutdown()
        ended = {r.label for r in fault_tools.runs("slow") if r.phase == "end"}
        assert KILLED_CALL not in ended, "the server went down after the call, not during it"
        await asyncio.sleep(OUTAGE_S)
        envs.append(await start_dev_server(port=port, db_filename=server_db))

        pending = asyncio.ensure_future(handle.result())
        turn, worker_restarts = await result_with_a_live_worker(
            pending, workers, new_worker, timeout_s=90
        )
        events = await tt.audit(turn.turn_id)
        record = await tt.store.turn(turn.turn_id)
        description = await handle.workflow_handle.describe()
        history = await handle.workflow_handle.fetch_history()
    finally:
        for worker in workers:
            await worker.kill()
        await store.close()
        for env in envs:
            await env.shutdown()

    body_starts = [r.label for r in fault_tools.runs("slow") if r.phase == "start"]
    reruns = {label: body_starts.count(label) for label in set(body_starts)}
    print(
        f"worker restarts {worker_restarts}; body runs per call {sorted(reruns.items())}; "
        f"tool attempts per activity {activity_attempts(history, TOOL_EXECUTE)}"
    )
    # The same execution finished the turn: its history outlived the server process.
    assert description.run_id == run_id
    assert [r.output for r in turn.results] == [f"c{i} done" for i in range(CALLS)]
    assert not any(r.is_error for r in turn.results)
    # Every call ran; only the interrupted one may have run twice (at least once).
    assert set(body_starts) == {c.id for c in calls}
    assert all(n == 1 for label, n in reruns.items() if label != KILLED_CALL), reruns
    # Exactly once in the audit trail, and the turn row says completed.
    assert_exactly_once(events, [c.id for c in calls])
    assert record is not None
    assert record.status == "completed"
