"""Tool bodies run on lanes of their own (issue 22, findings 4 and 9).

- An ``async def`` tool that blocks its event loop for longer than the heartbeat timeout runs
  once: the worker's loop (heartbeats, workflow tasks) never waits for it, and the log names
  the tool.
- Sync tools that hang hold only their own lanes: a healthy sync tool still runs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from typing import Any

import pytest

from tests.conftest import StackFactory
from tooltrail import Host, RunConfig, ToolCall, ToolContext, tool
from tooltrail.tools.body_lanes import run_async_body, run_sync_body

pytestmark = pytest.mark.timeout(120)

HEARTBEAT_S = 2.0
BLOCK_S = 5.0


async def test_async_tool_blocking_its_loop_runs_once(
    db_url: str, stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tooltrail.tool")
    runs: list[float] = []

    @tool
    async def sync_client_inside_async(ctx: ToolContext, label: str) -> str:
        """A blocking call inside async code (a sync HTTP client, say)."""
        runs.append(time.monotonic())
        time.sleep(BLOCK_S)  # noqa: ASYNC251 - the point of the test
        return f"{label} fetched"

    host = Host([sync_client_inside_async])
    async with stack(host, database_url=db_url) as tt:
        turn = await tt.run_turn(
            [ToolCall("c0", "sync_client_inside_async", {"label": "page"})],
            session_id=f"block-{uuid.uuid4()}",
            config=RunConfig(heartbeat_timeout_s=HEARTBEAT_S),
        )
    # Blocked for 2.5 heartbeat timeouts, yet one run and its result.
    assert len(runs) == 1, runs
    assert [(r.output, r.is_error) for r in turn.results] == [("page fetched", False)]
    reports = [r.getMessage() for r in caplog.records if "blocks its event loop" in r.getMessage()]
    assert reports and "'sync_client_inside_async'" in reports[0], reports


async def test_hung_sync_tools_do_not_starve_a_healthy_one(stack: StackFactory) -> None:
    hung = 12  # twice asyncio's default executor on this machine (min(32, cpus + 4) = 6)
    release = threading.Event()
    started = threading.Semaphore(0)

    @tool
    def hang(ctx: ToolContext, n: int) -> str:
        """Never returns until the test releases it."""
        started.release()
        release.wait(timeout=90)
        return f"released {n}"

    @tool
    def healthy(ctx: ToolContext) -> str:
        """Answers at once."""
        return "fine"

    host = Host([hang, healthy])
    async with stack(host) as tt:
        try:
            hung_turns = [
                await tt.start_turn(
                    [ToolCall("h", "hang", {"n": n})], session_id=f"hang-{uuid.uuid4()}"
                )
                for n in range(hung)
            ]
            deadline = time.monotonic() + 60
            for _ in range(hung):
                while not started.acquire(blocking=False):
                    assert time.monotonic() < deadline, "the hung bodies did not all start"
                    await asyncio.sleep(0.05)
            turn = await asyncio.wait_for(
                tt.run_turn([ToolCall("c0", "healthy", {})], session_id=f"ok-{uuid.uuid4()}"),
                timeout=30,
            )
            assert [(r.output, r.is_error) for r in turn.results] == [("fine", False)]
        finally:
            release.set()
        outputs = [(await h.result()).results[0].output for h in hung_turns]
    assert sorted(outputs) == sorted(f"released {n}" for n in range(hung))


async def test_lanes_keep_context_results_errors_and_cancellation() -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("caller")

    async def body() -> str:
        return var.get()

    assert await run_async_body("t", body) == "caller"
    assert await run_sync_body("t", var.get) == "caller"

    async def failing() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await run_async_body("t", failing)

    def sync_failing() -> None:
        raise KeyError("k")

    with pytest.raises(KeyError):
        await run_sync_body("t", sync_failing)

    cancelled = threading.Event()

    async def forever() -> Any:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.create_task(run_async_body("t", forever))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(cancelled.wait, 5)
