"""A worker paused (SIGSTOP) inside an idempotent body past its lease (issue 22, finding 11).

Two worker processes on one PostgreSQL database, each polling a task queue of its own. Worker
A runs an idempotent body (``charge``, a 1.5 s lease) for turn 1 and is stopped while the
body runs; its lease lapses. Turn 2 makes the same call (same arguments, so the same key) on
worker B, which waits out the lapsed lease, takes the claim over and runs the body. Then A is
continued while B's body runs: A's body ends first, and its renewal and its commit match no
row (the owner is fenced: the call id and attempt are the same in both turns), so it returns
its result uncached and its turn's trail says ``lease_lost=True``; the stored outcome is B's,
committed once, after B's body; both turns complete.

The turn's heartbeat timeout is longer than the pause on purpose: Temporal does not retry
A's attempt, so what is under test is the fence, not Temporal's retry (``test_two_workers``).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from temporalio.testing import WorkflowEnvironment

from tests.faults import fault_tools
from tests.faults.fault_tools import FAULT_DIR_ENV, LEASE_ENV, BodyRun
from tests.faults.history import assert_exactly_once
from tests.faults.workers import WorkerProcess, start_worker, wait_until
from tooltrail import RunConfig, ToolCall, Tooltrail
from tooltrail.db.orm import IdempotencyRecordRow
from tooltrail.db.store import AuditStore

pytestmark = [pytest.mark.crash, pytest.mark.postgres, pytest.mark.timeout(180)]

LEASE_S = 1.5
BODY_S = 3.0


def _post(events: list[Any]) -> Any:
    [post] = [e for e in events if e.kind == "tool_post"]
    return post


async def test_a_paused_owner_past_its_lease_cannot_commit(
    temporal_env: WorkflowEnvironment,
    postgres_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(LEASE_ENV, str(LEASE_S))  # read by the worker processes' tools
    address = temporal_env.client.service_client.config.target_host
    queues = {name: f"paused-{name}-{uuid.uuid4()}" for name in ("a", "b")}
    order = f"order-{uuid.uuid4()}"
    arguments = {"label": "c", "order": order, "seconds": BODY_S}
    # The same call id in both turns (a model's ids repeat across turns): only the fence
    # tells the two owners apart. Unique to this test, to find its claim.
    call_a = call_b = f"call-{order}"
    # Turn 1's heartbeat timeout outlives the pause: only the lease lapses, not the attempt.
    config = RunConfig(heartbeat_timeout_s=60)
    store = AuditStore(postgres_url)
    clients = {
        name: Tooltrail(temporal_env.client, fault_tools.host, task_queue=queue, store=store)
        for name, queue in queues.items()
    }
    workers: dict[str, WorkerProcess] = {}
    try:
        for name, queue in queues.items():
            workers[name] = await start_worker(address, queue, postgres_url, tmp_path, name=name)
        first = await clients["a"].start_turn(
            [ToolCall(call_a, "charge", arguments)],
            session_id=f"paused-a-{uuid.uuid4()}",
            config=config,
        )

        async def started(count: int) -> list[BodyRun] | None:
            starts = [r for r in fault_tools.runs("charge") if r.phase == "start"]
            return starts if len(starts) >= count else None

        [a_start] = await wait_until(lambda: started(1), timeout_s=60, what="A's body")
        assert a_start.pid == workers["a"].pid
        workers["a"].pause()
        try:
            second = await clients["b"].start_turn(
                [ToolCall(call_b, "charge", arguments)],
                session_id=f"paused-b-{uuid.uuid4()}",
                config=config,
            )
            # B waits for A's lapsed lease, takes the claim over and runs the body.
            [_, b_start] = await wait_until(lambda: started(2), timeout_s=60, what="B's body")
            assert b_start.pid == workers["b"].pid
        finally:
            # A goes on while B's body runs: A's overdue body ends at once, first, and tries
            # to renew and commit a claim that is B's now.
            workers["a"].resume()
        holder = await asyncio.wait_for(second.result(), timeout=90)
        stale = await asyncio.wait_for(first.result(), timeout=90)
        stale_events = await clients["a"].audit(stale.turn_id)
        holder_events = await clients["b"].audit(holder.turn_id)
        async with store.sessions() as session:
            query = select(IdempotencyRecordRow).where(IdempotencyRecordRow.tool_name == "charge")
            rows = (await session.scalars(query)).all()
    finally:
        for worker in workers.values():
            await worker.kill()
        await store.close()

    a_pid, b_pid = workers["a"].pid, workers["b"].pid
    runs = [(r.phase, r.pid) for r in fault_tools.runs("charge")]
    print(f"body runs (phase, pid): {runs}; A={workers['a'].pid} B={workers['b'].pid}")
    # The lease lapsed while A was stopped: B ran the body too; A, continued, ended first.
    assert runs == [("start", a_pid), ("start", b_pid), ("end", a_pid), ("end", b_pid)]
    stale_post, holder_post = _post(stale_events), _post(holder_events)
    # The stale owner's result is its own, uncached, and its trail says the lease was lost.
    assert stale.results[0].output == "charged c" and not stale.results[0].is_error
    assert (
        stale_post.payload["dispatch"]["status"],
        stale_post.payload["dispatch"]["lease_lost"],
    ) == ("ok", True)
    assert stale_post.temporal_attempt == 1  # Temporal did not retry A's attempt
    assert (
        holder_post.payload["dispatch"]["status"],
        holder_post.payload["dispatch"]["lease_lost"],
    ) == ("ok", False)
    assert holder_post.worker != stale_post.worker
    # Exactly one committed result, the holder's (the stale owner's commit matched no row).
    [row] = [r for r in rows if r.owner.startswith(f"{call_b}#")]
    assert row.state == "succeeded" and row.completed_at is not None
    # Committed once, by B after its body ended: A's commit, seconds earlier, matched no row.
    [b_end] = [r.at for r in fault_tools.runs("charge") if r.phase == "end" and r.pid == b_pid]
    assert row.completed_at.timestamp() >= b_end
    assert_exactly_once(stale_events, [call_a])
    assert_exactly_once(holder_events, [call_b])
