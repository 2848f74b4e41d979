"""Capacity: many concurrent waits for results, and the worker's slots and pool settings."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import pytest
from pydantic import ValidationError

from tests.conftest import StackFactory
from tooltrail import Host, RunConfig, ToolCall, Tooltrail, tool
from tooltrail.db.store import AuditStore
from tooltrail.runtime.embedded import start_dev_server
from tooltrail.runtime.worker import build_worker
from tooltrail.settings import Settings

WAITS = 1_500
TURNS = 500  # three waits per turn: each is a long poll of its own, as 1,500 turns' would be


@pytest.mark.timeout(600)
async def test_fifteen_hundred_concurrent_result_waits_all_return(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The dev server keeps Temporal's default of 1,200 concurrent long polls per namespace
    # (frontend.namespaceCount); a wait for a result is one. The turns are started with no
    # worker on their queue, so every wait is in flight at once before any turn can end.
    # Waits, not turns, count against the limit: three per turn keep the test short.
    # A server of its own: the test fills the namespace's long polls on purpose, which must
    # neither slow the session's other tests nor depend on the pollers they leave running.
    caplog.set_level(logging.INFO, logger="tooltrail.client")
    env = await start_dev_server()
    host = Host([])
    store = AuditStore(sqlite_url)
    task_queue = f"waits-{uuid.uuid4()}"
    tt = Tooltrail(env.client, host, task_queue=task_queue, store=store)
    waits: list[asyncio.Task[Any]] = []
    try:
        limit = asyncio.Semaphore(50)

        async def start(i: int) -> object:
            async with limit:
                return await tt.start_turn([], session_id=f"waits-{i % 20}")

        handles = await asyncio.gather(*(start(i) for i in range(TURNS)))
        waits += [
            asyncio.create_task(tt.get_turn(handle.turn_id).result())  # type: ignore[attr-defined]
            for handle in handles * (WAITS // TURNS)
        ]
        deadline = time.monotonic() + 120
        while not any("poller limit" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the server never refused a wait"
            assert not any(w.done() for w in waits), [w.exception() for w in waits if w.done()]
            await asyncio.sleep(0.5)
        async with build_worker(env.client, host, task_queue=task_queue, store=store):
            results = await asyncio.wait_for(asyncio.gather(*waits), timeout=400)
    finally:
        for wait in waits:  # a failed test leaves no poll behind
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        await store.close()
        await env.shutdown()
    assert len(results) == WAITS
    assert sorted(r.turn_id for r in results) == sorted(
        h.turn_id  # type: ignore[attr-defined]
        for h in handles * (WAITS // TURNS)
    )
    assert all(r.results == [] for r in results)


async def test_worker_slots_come_from_the_settings(
    stack: StackFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLTRAIL_MAX_CONCURRENT_ACTIVITIES", "2")
    running = {"now": 0, "most": 0}

    @tool(concurrent_safe=True)
    async def nap() -> str:
        """Hold an activity slot for a moment."""
        running["now"] += 1
        running["most"] = max(running["most"], running["now"])
        await asyncio.sleep(0.3)
        running["now"] -= 1
        return "rested"

    calls = [ToolCall(f"n{i}", "nap", {}) for i in range(6)]
    async with stack(Host([nap])) as tt:
        turn = await tt.run_turn(
            calls, session_id="slots", config=RunConfig(dispatch="parallel", max_concurrency=6)
        )
    assert [r.output for r in turn.results] == ["rested"] * 6
    assert running["most"] == 2, "six calls in one wave, two slots"


async def test_the_database_pool_comes_from_the_settings(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLTRAIL_DB_POOL_SIZE", "7")
    monkeypatch.setenv("TOOLTRAIL_DB_MAX_OVERFLOW", "3")
    monkeypatch.setenv("TOOLTRAIL_DB_POOL_TIMEOUT_S", "4.5")
    store = AuditStore(db_url)
    explicit = AuditStore(db_url, pool_size=2)
    try:
        pool: Any = store.engine.pool
        assert (pool.size(), pool._max_overflow, pool._timeout) == (7, 3, 4.5)
        assert explicit.engine.pool.size() == 2, "an engine's own arguments win"  # type: ignore[attr-defined]
        assert await store.turns(limit=1) is not None
    finally:
        await store.close()
        await explicit.close()


def test_capacity_settings_validate() -> None:
    settings = Settings(max_concurrent_workflow_tasks=5, db_pool_size=20)
    assert settings.worker_options()["max_concurrent_workflow_tasks"] == 5
    assert settings.pool_options() == {"pool_size": 20, "max_overflow": 10, "pool_timeout": 30.0}
    with pytest.raises(ValidationError):
        Settings(max_concurrent_workflow_tasks=1)  # the workflow cache needs two
    with pytest.raises(ValidationError, match="entry #2 is not PREFIX=COMMAND") as bad:
        Settings(mcp_servers=["gh=npx server", "token-in-here"])
    assert "token-in-here" not in str(bad.value)
    masked = Settings(mcp_servers=["web=https://user:s3cret@example.test/mcp"]).masked()
    assert masked["mcp_servers"] == ["web=https://user:****@example.test/mcp"]
