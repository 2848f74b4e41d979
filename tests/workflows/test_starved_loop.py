"""A worker whose event loop is starved past the heartbeat timeout (issues 22 and 35).

Heartbeats are sent from the worker's event loop (the SDK's heartbeat is a task on that
loop), so when something starves the loop itself for longer than
``RunConfig.heartbeat_timeout_s`` (here a tool declared ``own_loop=False`` that blocks it; in
production a backlog, CPU starvation or a paused process), Temporal takes the worker for lost
and retries the attempt while its body still runs on its lane. Since issue 35 the body is not
cancelled when the SDK learns the server gave up on it, and the retry, landing on the same
worker, waits for it and adopts its result: the body runs once, whatever its declaration, and
the trail names the Temporal attempt that ran it. (Before: a body that was neither idempotent
nor ``retry_on_interrupt=False`` ran twice, in parallel, and a ``retry_on_interrupt=False`` one
was answered "interrupted". A retry that lands on another worker process still runs the body:
docs/security.md.)
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from tests.conftest import StackFactory
from tooltrail import Host, RunConfig, ToolCall, ToolContext, tool

pytestmark = pytest.mark.timeout(120)

HEARTBEAT_S = 2.0
STARVE_S = 5.0
BODY_S = 8.0


@pytest.mark.parametrize("retry_on_interrupt", [True, False])
async def test_a_starved_loop_loses_the_attempt_while_its_body_runs(
    stack: StackFactory, retry_on_interrupt: bool
) -> None:
    starts: list[float] = []
    ends: list[float] = []
    cancelled: list[int] = []

    @tool(retry_on_interrupt=retry_on_interrupt)
    async def write(ctx: ToolContext, label: str) -> str:
        """A side effect that takes a while (not idempotent)."""
        starts.append(time.monotonic())
        try:
            await asyncio.sleep(BODY_S)
        except asyncio.CancelledError:
            cancelled.append(len(ends))
            raise
        finally:
            ends.append(time.monotonic())
        return f"{label} written"

    @tool(own_loop=False)
    async def hog(ctx: ToolContext) -> str:
        """Starves the worker's event loop (a stand-in for CPU starvation)."""
        time.sleep(STARVE_S)  # noqa: ASYNC251 - the fault under test
        return "done"

    async with stack(Host([write, hog])) as tt:
        handle = await tt.start_turn(
            [ToolCall("w", "write", {"label": "w"})],
            session_id=f"starved-{uuid.uuid4()}",
            config=RunConfig(heartbeat_timeout_s=HEARTBEAT_S),
        )
        deadline = time.monotonic() + 60
        while not starts:
            assert time.monotonic() < deadline, "the body did not start"
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # a heartbeat with the body's start mark goes out first
        # The hog's own attempt outlives its starvation: only the write's attempt is lost.
        hogging = await tt.start_turn(
            [ToolCall("h", "hog", {})],
            session_id=f"hog-{uuid.uuid4()}",
            config=RunConfig(heartbeat_timeout_s=60),
        )
        turn = await asyncio.wait_for(handle.result(), timeout=60)
        await asyncio.wait_for(hogging.result(), timeout=60)
        while len(ends) < len(starts):  # the first body still runs on its lane
            assert time.monotonic() < deadline + 30, "a body did not end"
            await asyncio.sleep(0.05)
        events = await tt.audit(turn.turn_id)

    [post] = [e for e in events if e.kind == "tool_post"]
    print(
        f"body starts {[round(s - starts[0], 1) for s in starts]}, ends"
        f" {[round(s - starts[0], 1) for s in ends]}, cancelled {cancelled};"
        f" {post.payload['output']!r}"
    )
    # Temporal retried the attempt; the body ran once, to its end, in attempt 1, whose
    # result the retry adopted.
    assert len(starts) == 1 and cancelled == [], (starts, ends, cancelled)
    assert (turn.results[0].output, turn.results[0].is_error) == ("w written", False)
    assert post.temporal_attempt == 1
    assert all(lost["temporal_attempt"] != 1 for lost in post.payload.get("lost_attempts", []))
