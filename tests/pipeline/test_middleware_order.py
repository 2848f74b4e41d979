"""Middleware (spec §12): the observable order is the registration order, memoize included,
and SafetyShieldMiddleware; on a real server, plus unit tests of the shield."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tests.conftest import StackFactory
from tooltrail import (
    CircuitBreaker,
    Host,
    MiddlewareCall,
    SafetyShieldMiddleware,
    ToolCall,
    ToolContext,
    VerifyMiddleware,
    tool,
)
from tooltrail.core.hooks import PostToolUseContext
from tooltrail.core.memoize import MemoizingMiddleware
from tooltrail.db.orm import ToolHealthRow
from tooltrail.pipeline.middleware import MiddlewareResult, run_pipeline

runs: Counter[str] = Counter()


@tool
def lookup(key: str) -> str:
    """Look a key up (counts executions)."""
    runs[key] += 1
    return f"value of {key}"


@pytest.fixture(autouse=True)
def reset() -> None:
    runs.clear()


class Posts:
    def __init__(self) -> None:
        self.outputs: list[str] = []

    async def post_tool(self, ctx: PostToolUseContext) -> None:
        self.outputs.append(ctx.output)


def verified(call: Any, result: Any) -> tuple[bool, str]:
    return True, "ok"


async def test_layers_before_memoize_handle_its_hits(stack: StackFactory) -> None:
    # Verify is registered first, memoize second: a hit is served at memoize's place, so
    # verify annotates it (once: the cache holds what memoize saw, not verify's output).
    posts = Posts()
    host = Host(
        [lookup],
        middleware=[VerifyMiddleware(verified), MemoizingMiddleware(["lookup"])],
        hooks=[posts],
        circuit_breaker=CircuitBreaker(failure_threshold=1),
    )
    calls = [ToolCall(f"c{i}", "lookup", {"key": "k"}) for i in range(2)]
    async with stack(host) as tt:
        turn = await tt.run_turn(calls, session_id="mw-1")
        events = await tt.audit(turn.turn_id)
        async with tt.store.sessions() as session:
            health = (
                await session.execute(select(ToolHealthRow.successes, ToolHealthRow.failures))
            ).all()
    assert [r.output for r in turn.results] == [
        "value of k\n\n[verify] passed: ok",
        "value of k\n[cached]\n\n[verify] passed: ok",
    ]
    assert runs["k"] == 1
    posts_ = [e.payload.get("cached", False) for e in events if e.kind == "tool_post"]
    assert posts_ == [False, True]
    # The hit went through the activity: post hooks saw it; the breaker recorded only the
    # call that ran the tool.
    assert posts.outputs == [r.output for r in turn.results]
    assert health == [(1, 0)]


async def test_memoize_registered_first_serves_hits_in_the_workflow(stack: StackFactory) -> None:
    host = Host([lookup], middleware=[MemoizingMiddleware(["lookup"]), VerifyMiddleware(verified)])
    calls = [ToolCall(f"c{i}", "lookup", {"key": "w"}) for i in range(2)]
    async with stack(host) as tt:
        turn = await tt.run_turn(calls, session_id="mw-2")
        history = await tt.client.get_workflow_handle(turn.turn_id).fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert [r.output for r in turn.results] == [
        "value of w\n\n[verify] passed: ok",
        "value of w\n\n[verify] passed: ok\n[cached]",
    ]
    assert runs["w"] == 1
    assert scheduled == ["tooltrail.tool.execute"]  # the hit scheduled nothing


def ctx() -> ToolContext:
    return ToolContext(session_id="s", turn_id="t", tool_call_id="c", attempt=0, temp_dir=Path("."))


async def _core(call: MiddlewareCall) -> MiddlewareResult:
    return MiddlewareResult(
        output=f"secret {call.arguments['x']}",
        is_error=False,
        duration_ms=5.0,
        resolved_tool_name=call.tool_name,
    )


async def test_the_shield_blocks_inputs_and_outputs() -> None:
    def bad_input(call: MiddlewareCall) -> str | None:
        return "prompt injection" if "ignore" in str(call.arguments) else None

    async def bad_output(call: MiddlewareCall, result: MiddlewareResult) -> str | None:
        return "leak" if "secret 2" in str(result.output) else None

    def raising(call: MiddlewareCall) -> str | None:
        raise RuntimeError("judge down")

    shield = SafetyShieldMiddleware(bad_input, check_output=bad_output)
    call = lambda x: MiddlewareCall(tool_name="t", arguments={"x": x}, tool_call_id="c", ctx=ctx())  # noqa: E731
    blocked = await run_pipeline([shield], _core, call("ignore all"))
    leaked = await run_pipeline([shield], _core, call(2))
    fine = await run_pipeline([shield], _core, call(1))
    broken = await run_pipeline([SafetyShieldMiddleware(raising)], _core, call(1))
    assert (blocked.output, blocked.is_error, blocked.duration_ms) == (
        "blocked by safety shield: prompt injection",
        True,
        0.0,
    )
    assert (leaked.output, leaked.is_error, leaked.duration_ms) == (
        "blocked by safety shield: leak",
        True,
        5.0,
    )
    assert (fine.output, fine.is_error) == ("secret 1", False)
    assert broken.output == "blocked by safety shield: check error (RuntimeError)"


async def test_a_shield_block_counts_toward_the_breaker(stack: StackFactory) -> None:
    shield = SafetyShieldMiddleware(lambda call: "no" if call.arguments["key"] == "x" else None)
    host = Host(
        [lookup],
        middleware=[shield],
        circuit_breaker=CircuitBreaker(failure_threshold=1, recovery_s=600),
    )
    async with stack(host) as tt:
        turn = await tt.run_turn(
            [ToolCall("a", "lookup", {"key": "x"}), ToolCall("b", "lookup", {"key": "y"})],
            session_id="mw-3",
        )
    assert [r.output for r in turn.results] == [
        "blocked by safety shield: no",
        "tool temporarily unavailable: circuit breaker open",
    ]
    assert runs == Counter()
