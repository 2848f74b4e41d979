"""A Temporal retry of a tool attempt is the same attempt (pipeline spec §0 rule 1).

- A half-open probe whose worker is SIGKILLed mid-body is retried on another worker: the
  retry is not refused by the breaker (its own probe's live lease), and its outcome is
  recorded once (issue 18, item 6).
- A body that returned while the audit database was down, on a worker that is then
  SIGKILLed: the next worker adopts the journaled result and the body never runs again
  (issue 22, finding 2).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from tests.faults import fault_tools
from tests.faults.fault_tools import BIG_OUTPUT_CHARS, BREAKER, BREAKER_ENV, FAULT_DIR_ENV
from tests.faults.pg import ThrowawayPostgres
from tests.faults.workers import WorkerProcess, start_worker, wait_until
from tooltrail import RunConfig, ToolCall, Tooltrail
from tooltrail.core.text import BREAKER_OPEN
from tooltrail.core.wire import TOOL_EXECUTE
from tooltrail.db.health import HealthStore
from tooltrail.db.migrate import upgrade
from tooltrail.db.store import AuditStore

pytestmark = [pytest.mark.crash, pytest.mark.timeout(150)]


async def _heartbeat_holds(handle: WorkflowHandle[object, object], marker: bytes) -> bool | None:
    """Whether the tool activity's last recorded heartbeat holds ``marker`` (None: not yet)."""
    described = await handle.describe()
    for pending in described.raw_description.pending_activities:
        if pending.activity_type.name != TOOL_EXECUTE:
            continue
        if any(marker in payload.data for payload in pending.heartbeat_details.payloads):
            return True
    return None


async def test_lost_half_open_probe_is_retried_not_refused(
    temporal_env: WorkflowEnvironment,
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(BREAKER_ENV, "1")
    address = temporal_env.client.service_client.config.target_host
    task_queue = f"probe-{uuid.uuid4()}"
    label = f"probe-{uuid.uuid4().hex[:8]}"
    store = AuditStore(db_url)
    health = HealthStore(store)
    # The breaker of `slow` is open (one failure) and its cooldown (0.1 s) over: the next
    # call is the half-open probe, whose lease (120 s) outlives any retry of this test.
    await health.record("slow", is_error=True, duration_ms=1.0, config=BREAKER)
    seeded = await health.snapshot("slow")
    assert seeded is not None and seeded.state == "open"
    await asyncio.sleep(0.2)
    tt = Tooltrail(temporal_env.client, fault_tools.host, task_queue=task_queue, store=store)
    workers: list[WorkerProcess] = []
    try:
        workers.append(await start_worker(address, task_queue, db_url, tmp_path, name="w1"))
        handle = await tt.start_turn(
            [ToolCall("c0", "slow", {"label": label, "seconds": 4.0})],
            session_id=f"probe-{uuid.uuid4()}",
            config=RunConfig(heartbeat_timeout_s=2),
        )

        async def body_started() -> bool | None:
            return True if fault_tools.runs("slow") else None

        await wait_until(body_started, timeout_s=60, what="the probe's body")
        probing = await health.snapshot("slow")
        assert probing is not None and probing.state == "half_open"
        assert await workers[0].kill() == -9
        workers.append(await start_worker(address, task_queue, db_url, tmp_path, name="w2"))
        turn = await asyncio.wait_for(handle.result(), timeout=90)
        after = await health.snapshot("slow")
    finally:
        for worker in workers:
            await worker.kill()
        await store.close()

    starts = [(r.label, r.pid) for r in fault_tools.runs("slow") if r.phase == "start"]
    print(f"probe bodies: {starts}; breaker after: {after}")
    # The retry was the same attempt: it ran (on w2), it was not refused by its own probe.
    [result] = turn.results
    assert result.output != BREAKER_OPEN
    assert (result.output, result.is_error) == (f"{label} done", False)
    assert starts == [(label, workers[0].pid), (label, workers[1].pid)]
    # Its outcome was recorded once: the probe succeeded and closed the breaker, and the
    # seeded failure is still the only failure.
    assert after is not None
    assert (after.state, after.successes, after.failures) == ("closed", 1, 1)


@pytest.mark.postgres
async def test_journaled_result_is_adopted_by_the_next_worker(
    temporal_env: WorkflowEnvironment,
    throwaway_pg: ThrowawayPostgres,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    url = throwaway_pg.url
    await upgrade(url)
    address = temporal_env.client.service_client.config.target_host
    task_queue = f"journal-{uuid.uuid4()}"
    label = f"big-{uuid.uuid4().hex[:8]}"
    store = AuditStore(url)
    tt = Tooltrail(temporal_env.client, fault_tools.host, task_queue=task_queue, store=store)
    workers: list[WorkerProcess] = []
    try:
        workers.append(await start_worker(address, task_queue, url, tmp_path, name="w1"))
        handle = await tt.start_turn(
            [ToolCall("c0", "big", {"label": label, "seconds": 1.0})],
            session_id=f"journal-{uuid.uuid4()}",
            config=RunConfig(heartbeat_timeout_s=2),
        )

        async def body_started() -> bool | None:
            return True if fault_tools.runs("big") else None

        await wait_until(body_started, timeout_s=60, what="the body")
        await throwaway_pg.stop()
        try:
            # The body returns; its 300 KB cannot be stored; the attempt holds its result
            # and heartbeats it (the journal) while it retries the write.
            await wait_until(
                lambda: _heartbeat_holds(handle.workflow_handle, label.encode()),
                timeout_s=30,
                interval_s=0.1,
                what="the journaled result on the server",
            )
            assert await workers[0].kill() == -9
        finally:
            await throwaway_pg.start()
        workers.append(await start_worker(address, task_queue, url, tmp_path, name="w2"))
        turn = await asyncio.wait_for(handle.result(), timeout=90)
        history = await handle.workflow_handle.fetch_history()
    finally:
        for worker in workers:
            await worker.kill()
        await store.close()

    starts = [(r.label, r.pid) for r in fault_tools.runs("big") if r.phase == "start"]
    tool_attempts = [
        event.activity_task_started_event_attributes.attempt
        for event in history.events
        if event.HasField("activity_task_started_event_attributes")
    ]
    print(f"bodies: {starts}; tool activity attempts started: {tool_attempts}")
    # The body ran once, on the worker that was killed; the next one adopted its result.
    assert starts == [(label, workers[0].pid)]
    [result] = turn.results
    assert not result.is_error, result.output
    assert isinstance(result.output, str)
    assert len(result.output) == BIG_OUTPUT_CHARS and result.output.startswith(label)
