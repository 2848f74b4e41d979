"""Loop detection in the turn workflow (spec §10), with the window carried across turns."""

from __future__ import annotations

from itertools import count
from typing import Any

import pytest

from tests.conftest import StackFactory
from tooltrail import Host, LoopDetected, LoopDetection, RunConfig, ToolCall, tool
from tooltrail.core.hooks import Block, PreToolUseContext

runs: list[str] = []
_counter = count()


@tool
def same(text: str = "x") -> str:
    """Always the same answer."""
    runs.append(text)
    return "same"


@tool
def changing() -> str:
    """A different answer every time."""
    return f"value {next(_counter)}"


@pytest.fixture(autouse=True)
def reset() -> None:
    runs.clear()


def calls(n: int, name: str = "same", start: int = 0) -> list[ToolCall]:
    return [ToolCall(f"c{i}", name, {}) for i in range(start, start + n)]


async def test_the_eleventh_identical_call_is_refused(stack: StackFactory) -> None:
    async with stack(Host([same])) as tt:
        handle = await tt.start_turn(calls(11), session_id="loop-1")
        with pytest.raises(LoopDetected) as raised:
            await handle.result()
        events = await tt.audit(handle.turn_id)
        row = await tt.store.turn(handle.turn_id)
    assert raised.value.message == "same({}) repeated 10 times"
    assert str(raised.value) == "Loop detected: same({}) repeated 10 times"
    assert len(runs) == 10
    refusal = [e for e in events if e.kind == "tool_post" and e.tool_call_id == "c10"]
    assert [e.payload["output"] for e in refusal] == [
        "dispatch refused before execution: Loop detected: same({}) repeated 10 times"
    ]
    detected = [e for e in events if e.kind == "loop_detected"]
    assert [e.tool_call_id for e in detected] == [f"c{i}" for i in range(3, 11)]
    assert [e.payload["repetitions"] for e in detected] == [3, 4, 5, 6, 7, 8, 9, 10]
    assert detected[-1].payload["stop"] is True
    assert row is not None and (row.status, row.error_type) == ("failed", "LoopDetected")


async def test_changing_results_never_stop(stack: StackFactory) -> None:
    async with stack(Host([changing])) as tt:
        turn = await tt.run_turn(calls(15, "changing"), session_id="loop-2")
    assert len(turn.results) == 15 and not any(r.is_error for r in turn.results)


async def test_stop_threshold_zero_warns_but_never_stops(stack: StackFactory) -> None:
    config = RunConfig(detection=LoopDetection(stop_threshold=0))
    async with stack(Host([same])) as tt:
        turn = await tt.run_turn(calls(12), session_id="loop-3", config=config)
        events = await tt.audit(turn.turn_id)
    assert len(runs) == 12
    assert sum(e.kind == "loop_detected" for e in events) == 9


async def test_the_window_spans_turns_and_workers(stack: StackFactory, sqlite_url: str) -> None:
    async with stack(Host([same]), database_url=sqlite_url) as tt:
        await tt.run_turn(calls(6), session_id="loop-4")
    # A new worker (and client) on the same database: the window comes from the session.
    async with stack(Host([same]), database_url=sqlite_url) as tt:
        handle = await tt.start_turn(calls(5, start=6), session_id="loop-4")
        with pytest.raises(LoopDetected):
            await handle.result()
        # The stop consumed the pattern: the session's next turn dispatches again.
        turn = await tt.run_turn(calls(1, start=20), session_id="loop-4")
        # Another session is not affected by this one's window.
        other = await tt.run_turn(calls(9), session_id="loop-5")
    assert len(runs) == 10 + 1 + 9
    assert turn.results[0].output == "same"
    assert len(other.results) == 9


async def test_a_stop_on_call_two_means_call_three_never_starts(stack: StackFactory) -> None:
    async with stack(Host([same, changing])) as tt:
        await tt.run_turn(calls(9), session_id="loop-6")
        handle = await tt.start_turn(
            [*calls(2, start=9), ToolCall("c11", "changing", {})], session_id="loop-6"
        )
        with pytest.raises(LoopDetected):
            await handle.result()
        events = await tt.audit(handle.turn_id)
    assert len(runs) == 10
    assert [e.kind for e in events if e.tool_call_id == "c11"] == ["tool_call_received"]


async def test_ends_run_clears_a_pattern_at_stop_level(stack: StackFactory) -> None:
    async with stack(Host([same])) as tt:
        await tt.run_turn(calls(10), session_id="loop-7", ends_run=True)
        turn = await tt.run_turn(calls(1, start=10), session_id="loop-7")
    assert turn.results[0].output == "same" and len(runs) == 11


class BlockAfter:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.asked = 0

    async def pre_tool(self, ctx: PreToolUseContext) -> Any:
        self.asked += 1
        return Block("hook says stop first") if self.asked > self.limit else None


async def test_a_hook_block_comes_before_the_loop_stop(stack: StackFactory) -> None:
    hook = BlockAfter(10)
    async with stack(Host([same], hooks=[hook])) as tt:
        turn = await tt.run_turn(calls(11), session_id="loop-8")
        events = await tt.audit(turn.turn_id)
    assert turn.results[-1].output == "hook says stop first"
    assert not any(e.kind == "loop_detected" and e.payload["stop"] for e in events)
