"""A body that hangs is started once per tooltrail attempt, never again by Temporal unseen.

A tool without ``timeout_s`` is bounded by the turn's ``tool_timeout_s``, Temporal's
start-to-close timeout of the attempt. Temporal used to retry that timeout as if the worker
had been lost: an ``async def`` body that never returns was started
``infrastructure_retries`` (5) times, and the trail showed one attempt. A lost worker is
noticed by the heartbeat timeout (``test_lost_attempts``), which is still retried.

Real Temporal dev server, SQLite.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest

from tests.conftest import StackFactory
from tooltrail import AlwaysRecoverable, FixedDelay, Host, NoRetry, RunConfig, ToolCall, tool

starts: Counter[str] = Counter()
"""Body starts per key (each test uses a key of its own)."""
stopped: Counter[str] = Counter()
"""Bodies cancelled per key (the worker stops a body whose attempt timed out)."""


async def _hang(key: str) -> str:
    starts[key] += 1
    try:
        await asyncio.Event().wait()
    finally:
        stopped[key] += 1
    return "never"


@tool
async def hang(key: str) -> str:
    """Never return (a regular activity)."""
    return await _hang(key)


@tool(local=True)
async def hang_local(key: str) -> str:
    """Never return (a local activity)."""
    return await _hang(key)


async def until_stopped(key: str, count: int) -> None:
    """Wait until ``count`` bodies of ``key`` were cancelled (a heartbeat tells the worker)."""
    for _ in range(300):
        if stopped[key] >= count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{stopped[key]} of {count} bodies of {key!r} were stopped")


@pytest.mark.parametrize("name", ["hang", "hang_local"])
async def test_a_hung_body_without_timeout_s_starts_once_and_answers_timed_out(
    stack: StackFactory, name: str
) -> None:
    key = f"once-{uuid.uuid4()}"
    config = RunConfig(tool_timeout_s=1, recovery=NoRetry())
    async with stack(Host([hang, hang_local])) as tt:
        turn = await tt.run_turn(
            [ToolCall("c1", name, {"key": key})], session_id=f"s-{key}", config=config
        )
        events = await tt.audit(turn.turn_id)
        await until_stopped(key, 1)
    assert starts[key] == 1, f"the hung body was started {starts[key]} times"
    (result,) = turn.results
    assert (result.is_error, result.output) == (True, f"Tool '{name}' timed out after 1s")
    # The one start is the one attempt of the trail.
    posts = [e for e in events if e.kind == "tool_post"]
    assert [(e.attempt, e.payload["output"]) for e in posts] == [(0, result.output)]
    assert [e.attempt for e in events if e.kind == "tool_pre"] == [0]


async def test_recovery_retries_a_timed_out_attempt_as_recorded_attempts(
    stack: StackFactory,
) -> None:
    # Recovery may retry a timed-out call: each retry is an attempt of the trail, with its
    # own start of the body, and nothing else starts it.
    key = f"recovered-{uuid.uuid4()}"
    config = RunConfig(tool_timeout_s=1, recovery=FixedDelay(2, 0))
    async with stack(Host([hang], reflector=AlwaysRecoverable())) as tt:
        turn = await tt.run_turn(
            [ToolCall("c1", "hang", {"key": key})], session_id=f"s-{key}", config=config
        )
        events = await tt.audit(turn.turn_id)
        await until_stopped(key, 3)
    posts = [e for e in events if e.kind == "tool_post"]
    assert starts[key] == len(posts) == 3, f"{starts[key]} starts, {len(posts)} attempts"
    assert [e.attempt for e in posts] == [0, 1, 2]
    (result,) = turn.results
    assert (result.is_error, result.output) == (True, "Tool 'hang' timed out after 1s")
    assert {e.payload["output"] for e in posts} == {result.output}
