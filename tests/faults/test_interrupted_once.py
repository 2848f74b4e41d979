"""A ``retry_on_interrupt=False`` tool whose worker is SIGKILLed mid-body must not run again.

The retried attempt finds the ``body-started`` heartbeat detail of the lost one and answers
that the call was interrupted. The kill comes at the worst moment the server can see: once the
heartbeat it recorded no longer carries that detail (or after a few seconds of body time, when
it always does). ``once`` is a plain tool; ``transfer`` is also idempotent: its lease renewals
heartbeat too, and every heartbeat carries all of the attempt's details (a renewal without
them once erased the detail on the server, and the body ran again).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from tests.faults import fault_tools
from tests.faults.fault_tools import FAULT_DIR_ENV, BodyRun
from tests.faults.history import assert_exactly_once
from tests.faults.workers import WorkerProcess, start_worker, wait_until
from tooltrail import RunConfig, ToolCall, Tooltrail
from tooltrail.activities.tool_execution import BODY_STARTED, interrupted_text
from tooltrail.core.wire import TOOL_EXECUTE
from tooltrail.db.store import AuditStore

pytestmark = [pytest.mark.crash, pytest.mark.timeout(150)]

BODY_S = 9.0
# How long to wait for the server to record a heartbeat without the detail before killing
# anyway (the SDK sends heartbeats at most every 0.8 x the 2 s heartbeat timeout).
DETAIL_WATCH_S = 5.0


async def body_started_on_server(handle: WorkflowHandle[object, object]) -> bool | None:
    """Whether the tool activity's last recorded heartbeat says the body started
    (``None``: no tool activity pending, or no heartbeat recorded yet)."""
    described = await handle.describe()
    for pending in described.raw_description.pending_activities:
        if pending.activity_type.name != TOOL_EXECUTE or not pending.HasField(
            "last_heartbeat_time"
        ):
            continue
        payloads = pending.heartbeat_details.payloads
        return any(BODY_STARTED.encode() in payload.data for payload in payloads)
    return None


@pytest.mark.parametrize(
    "tool_name",
    ["once", "transfer"],
)
async def test_interrupted_tool_is_not_run_again(
    tool_name: str,
    temporal_env: WorkflowEnvironment,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    address = temporal_env.client.service_client.config.target_host
    task_queue = f"once-{uuid.uuid4()}"
    order = f"order-{uuid.uuid4()}"
    store = AuditStore(sqlite_url)
    tt = Tooltrail(temporal_env.client, fault_tools.host, task_queue=task_queue, store=store)
    workers: list[WorkerProcess] = []
    try:
        workers.append(await start_worker(address, task_queue, sqlite_url, tmp_path, name="w1"))
        handle = await tt.start_turn(
            [ToolCall("c0", tool_name, {"order": order, "seconds": BODY_S})],
            session_id=f"once-{uuid.uuid4()}",
            config=RunConfig(heartbeat_timeout_s=2),
        )

        async def body_started() -> BodyRun | None:
            return next(iter(fault_tools.runs(tool_name)), None)

        first = await wait_until(body_started, timeout_s=60, what="the body")
        assert first.pid == workers[0].pid
        detail_lost = False
        watch_until = time.monotonic() + DETAIL_WATCH_S
        while time.monotonic() < watch_until:
            if await body_started_on_server(handle.workflow_handle) is False:
                detail_lost = True
                break
            await asyncio.sleep(0.1)
        assert await workers[0].kill() == -9
        workers.append(await start_worker(address, task_queue, sqlite_url, tmp_path, name="w2"))
        turn = await asyncio.wait_for(handle.result(), timeout=90)
        events = await tt.audit(turn.turn_id)
    finally:
        for worker in workers:
            await worker.kill()
        await store.close()

    body_runs = [(r.phase, r.pid) for r in fault_tools.runs(tool_name)]
    print(f"{tool_name}: detail lost on the server before the kill: {detail_lost}; {body_runs}")
    try:
        assert_exactly_once(events, ["c0"], {r.tool_call_id for r in turn.results if r.is_error})
    except AssertionError as exc:
        pytest.fail(f"audit trail: {exc}")
    assert body_runs == [("start", workers[0].pid)], "the interrupted body ran again"
    assert turn.results[0].output == interrupted_text(tool_name)
    assert turn.results[0].is_error
