"""Hooks (spec §7): the turn number in their contexts, and an approved ``Ask`` in parallel
mode re-reading the loop pre-check, on a real server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import StackFactory
from tests.pipeline.test_hooks_observers import wait_parked
from tooltrail import Host, LoopDetected, LoopDetection, RunConfig, ToolCall, tool
from tooltrail.core.hooks import Ask, PostToolUseContext, PreToolUseContext

ran: list[str] = []


@tool(concurrent_safe=True)
def same(name: str = "x") -> str:
    """Always the same answer."""
    ran.append(name)
    return "same"


@pytest.fixture(autouse=True)
def reset() -> None:
    ran.clear()


class Numbers:
    def __init__(self) -> None:
        self.pre: list[int] = []
        self.post: list[int] = []

    async def pre_tool(self, ctx: PreToolUseContext) -> Any:
        self.pre.append(ctx.turn_number)
        return None

    async def post_tool(self, ctx: PostToolUseContext) -> None:
        self.post.append(ctx.turn_number)


async def test_hook_contexts_carry_the_turn_number(stack: StackFactory) -> None:
    hook = Numbers()
    async with stack(Host([same], hooks=[hook])) as tt:
        for turn in range(3):
            await tt.run_turn([ToolCall(f"c{turn}", "same", {"name": f"t{turn}"})], session_id="n1")
        # Another session counts its own turns.
        await tt.run_turn([ToolCall("o", "same", {})], session_id="n2")
    assert hook.pre == [0, 1, 2, 0] and hook.post == [0, 1, 2, 0]


class AskFor:
    def __init__(self, call_id: str) -> None:
        self.call_id = call_id

    async def pre_tool(self, ctx: PreToolUseContext) -> Any:
        return Ask("go on?") if ctx.tool_call_id == self.call_id else None


async def test_an_approved_ask_rereads_the_loop_precheck(stack: StackFactory) -> None:
    # The ask parks; meanwhile its three siblings record three identical operations, a
    # stop-level pattern. Approved, the call is checked again and refused (before the fix it
    # ran on the empty window it saw before the wait).
    config = RunConfig(
        dispatch="parallel",
        interactive=True,
        approval_timeout_s=60,
        detection=LoopDetection(loop_threshold=2, stop_threshold=3),
    )
    calls = [ToolCall("ask", "same", {"name": "asked"})] + [
        ToolCall(f"s{i}", "same", {}) for i in range(3)
    ]
    async with stack(Host([same], hooks=[AskFor("ask")])) as tt:
        handle = await tt.start_turn(calls, session_id="n3", config=config)
        await wait_parked(handle)
        for _ in range(200):
            if len(ran) == 3:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the siblings' results reach the workflow
        await handle.approve("ask", by="alice")
        with pytest.raises(LoopDetected) as raised:
            await handle.result()
        events = await tt.audit(handle.turn_id)
    assert raised.value.message == "same({}) repeated 3 times"
    assert ran == ["x"] * 3
    kinds = [e.kind for e in events if e.tool_call_id == "ask"]
    assert kinds[-3:] == ["hook_decision", "loop_detected", "tool_post"]
