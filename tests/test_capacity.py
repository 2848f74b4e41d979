"""Capacity: many concurrent waits for results, and the worker's slots and pool settings."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import pytest
from temporalio.testing import WorkflowEnvironment

from tooltrail import Host, Tooltrail
from tooltrail.db.store import AuditStore
from tooltrail.worker import build_worker

WAITS = 1_500
TURNS = 500  # three waits per turn: each is a long poll of its own, as 1,500 turns' would be


@pytest.mark.timeout(600)
async def test_fifteen_hundred_concurrent_result_waits_all_return(
    temporal_env: WorkflowEnvironment, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The dev server keeps Temporal's default of 1,200 concurrent long polls per namespace
    # (frontend.namespaceCount); a wait for a result is one. The turns are started with no
    # worker on their queue, so every wait is in flight at once before any turn can end.
    # Waits, not turns, count against the limit: three per turn keep the test short.
    caplog.set_level(logging.INFO, logger="tooltrail.client")
    host = Host([])
    store = AuditStore(sqlite_url)
    task_queue = f"waits-{uuid.uuid4()}"
    tt = Tooltrail(temporal_env.client, host, task_queue=task_queue, store=store)
    try:
        limit = asyncio.Semaphore(50)

        async def start(i: int) -> object:
            async with limit:
                return await tt.start_turn([], session_id=f"waits-{i % 20}")

        handles = await asyncio.gather(*(start(i) for i in range(TURNS)))
        waits = [
            asyncio.create_task(tt.get_turn(handle.turn_id).result())  # type: ignore[attr-defined]
            for handle in handles * (WAITS // TURNS)
        ]
        deadline = time.monotonic() + 120
        while not any("poller limit" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the server never refused a wait"
            assert not any(w.done() for w in waits), [w.exception() for w in waits if w.done()]
            await asyncio.sleep(0.5)
        async with build_worker(temporal_env.client, host, task_queue=task_queue, store=store):
            results = await asyncio.wait_for(asyncio.gather(*waits), timeout=400)
    finally:
        await store.close()
    assert len(results) == WAITS
    assert sorted(r.turn_id for r in results) == sorted(
        h.turn_id  # type: ignore[attr-defined]
        for h in handles * (WAITS // TURNS)
    )
    assert all(r.results == [] for r in results)
