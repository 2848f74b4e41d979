"""Parallel dispatch on a real Temporal server (spec §9.3): waves, order, limits, hard errors.

Overlap and concurrency are judged from the audit trail: every ``tool_post`` records when
the tool body actually started and finished on the worker.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import StackFactory
from tests.faults.history import intervals, max_overlap
from tooltrail import (
    AlwaysRecoverable,
    FixedDelay,
    Host,
    RetryForever,
    RunConfig,
    ToolCall,
    ToolError,
    ToolRecoveryExhausted,
    Tooltrail,
    TurnCancelled,
    tool,
)

PARALLEL = RunConfig(dispatch="parallel")


@tool(concurrent_safe=True)
async def nap(ms: int, label: str = "") -> str:
    """Sleep, then answer."""
    await asyncio.sleep(ms / 1000)
    return label or f"slept {ms}"


@tool(concurrent_safe=True)
async def bad() -> str:
    """Fail softly."""
    raise ToolError("bad call")


@tool
async def exclusive(ms: int) -> str:
    """An unsafe call: runs alone."""
    await asyncio.sleep(ms / 1000)
    return "exclusive"


@tool(concurrent_safe=True, resource_key=lambda args: args["path"])
async def write(path: str) -> str:
    """Touch a resource."""
    await asyncio.sleep(0.05)
    return f"wrote {path}"


async def turn_events(tt: Tooltrail, calls: list[ToolCall], config: RunConfig) -> Any:
    turn = await tt.run_turn(calls, session_id="p", config=config)
    return turn, await tt.audit(turn.turn_id)


async def test_results_keep_call_order_when_finish_order_differs(stack: StackFactory) -> None:
    async with stack(Host([nap])) as tt:
        turn, events = await turn_events(
            tt,
            [
                ToolCall("c", "nap", {"ms": 400, "label": "c"}),
                ToolCall("a", "nap", {"ms": 0, "label": "a"}),
                ToolCall("b", "nap", {"ms": 200, "label": "b"}),
            ],
            PARALLEL,
        )
    assert [r.output for r in turn.results] == ["c", "a", "b"]
    assert [r.tool_call_id for r in turn.results] == ["c", "a", "b"]
    finish_order = [e.tool_call_id for e in events if e.kind == "tool_post"]
    assert finish_order == ["a", "b", "c"]
    assert all(e.tool_call_id for e in events if e.kind in {"tool_pre", "tool_post"})


async def test_safe_calls_overlap(stack: StackFactory) -> None:
    async with stack(Host([nap])) as tt:
        _, events = await turn_events(
            tt, [ToolCall(f"c{i}", "nap", {"ms": 300}) for i in range(3)], PARALLEL
        )
    spans = intervals(events)
    first_finish = min(f for _, f in spans.values())
    assert all(start < first_finish for start, _ in spans.values()), spans


async def test_soft_errors_are_collected(stack: StackFactory) -> None:
    async with stack(Host([nap, bad])) as tt:
        turn, _ = await turn_events(
            tt,
            [
                ToolCall("1", "nap", {"ms": 0}),
                ToolCall("2", "bad", {}),
                ToolCall("3", "nap", {"ms": 0}),
            ],
            PARALLEL,
        )
    assert [(r.output, r.is_error) for r in turn.results] == [
        ("slept 0", False),
        ("bad call", True),
        ("slept 0", False),
    ]


async def test_max_concurrency_is_respected(stack: StackFactory) -> None:
    async with stack(Host([nap])) as tt:
        _, events = await turn_events(
            tt,
            [ToolCall(f"c{i}", "nap", {"ms": 300}) for i in range(6)],
            RunConfig(dispatch="parallel", max_concurrency=2),
        )
    assert max_overlap(list(intervals(events).values())) == 2


async def test_unsafe_calls_run_alone_and_are_not_barriers(stack: StackFactory) -> None:
    async with stack(Host([nap, exclusive])) as tt:
        turn, events = await turn_events(
            tt,
            [
                ToolCall("s1", "nap", {"ms": 200}),
                ToolCall("u", "exclusive", {"ms": 200}),
                ToolCall("s2", "nap", {"ms": 200}),
            ],
            PARALLEL,
        )
    spans = intervals(events)
    # Plan [[s1, s2], [u]]: s2 runs with s1, before the unsafe call.
    assert spans["s2"][0] < spans["s1"][1]
    assert spans["u"][0] >= max(spans["s1"][1], spans["s2"][1])
    assert [r.tool_call_id for r in turn.results] == ["s1", "u", "s2"]


async def test_equal_resource_keys_never_share_a_wave(stack: StackFactory) -> None:
    async with stack(Host([write])) as tt:
        _, events = await turn_events(
            tt,
            [
                ToolCall("a1", "write", {"path": "/a"}),
                ToolCall("a2", "write", {"path": "/a"}),
                ToolCall("b", "write", {"path": "/b"}),
            ],
            PARALLEL,
        )
    spans = intervals(events)
    assert spans["a2"][0] >= spans["a1"][1]
    assert spans["b"][0] < spans["a1"][1]


async def test_a_hard_error_cancels_the_wave_and_discards_siblings(stack: StackFactory) -> None:
    config = RunConfig(dispatch="parallel", recovery=RetryForever())
    async with stack(Host([nap, bad], reflector=AlwaysRecoverable())) as tt:
        handle = await tt.start_turn(
            [
                ToolCall("done", "nap", {"ms": 0}),
                ToolCall("slow", "nap", {"ms": 30_000}),
                ToolCall("fails", "bad", {}),
            ],
            session_id="p",
            config=config,
        )
        with pytest.raises(ToolRecoveryExhausted) as raised:
            await handle.result()
        events = await tt.audit(handle.turn_id)
    assert (raised.value.tool, raised.value.attempts) == ("bad", 6)
    kinds = [(e.kind, e.tool_call_id) for e in events]
    assert ("tool_post", "done") in kinds, "a finished sibling's events stay in the audit trail"
    assert ("tool_pre", "slow") in kinds and ("tool_post", "slow") not in kinds
    assert events[-1].kind == "turn_end" and events[-1].payload["results"] == []


async def test_cancel_mid_wave_discards_finished_results(stack: StackFactory) -> None:
    async with stack(Host([nap])) as tt:
        handle = await tt.start_turn(
            [ToolCall("fast", "nap", {"ms": 0}), ToolCall("slow", "nap", {"ms": 10_000})],
            session_id="p",
            # audit_interval_s=0: the trail is written before each call, so the fast call's
            # result is visible while the slow one runs.
            config=RunConfig(
                dispatch="parallel", max_concurrency=1, heartbeat_timeout_s=1, audit_interval_s=0
            ),
        )
        for _ in range(400):
            if any(e.kind == "tool_post" for e in await tt.audit(handle.turn_id)):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        await handle.cancel()
        with pytest.raises(TurnCancelled):
            await handle.result()
        events = await tt.audit(handle.turn_id)
    cancelled = next(e for e in events if e.kind == "turn_cancelled")
    assert cancelled.payload["finished_calls"] == ["fast"]
    assert ("tool_post", "slow") not in [(e.kind, e.tool_call_id) for e in events]


async def test_retried_call_fires_events_per_attempt_in_parallel_mode(
    stack: StackFactory,
) -> None:
    config = RunConfig(dispatch="parallel", recovery=FixedDelay(2, 0))
    async with stack(Host([nap, bad], reflector=AlwaysRecoverable())) as tt:
        turn, events = await turn_events(
            tt, [ToolCall("ok", "nap", {"ms": 0}), ToolCall("x", "bad", {})], config
        )
    per_call = [e.kind for e in events if e.tool_call_id == "x"]
    assert per_call.count("tool_pre") == 3 and per_call.count("tool_post") == 3
    assert turn.results[1].output == "bad call"


async def test_a_single_call_takes_the_sequential_path(stack: StackFactory) -> None:
    async with stack(Host([nap])) as tt:
        par, par_events = await turn_events(tt, [ToolCall("c", "nap", {"ms": 0})], PARALLEL)
        seq, seq_events = await turn_events(tt, [ToolCall("c", "nap", {"ms": 0})], RunConfig())
    assert par.results[0].output == seq.results[0].output == "slept 0"
    assert [e.kind for e in par_events] == [e.kind for e in seq_events]
