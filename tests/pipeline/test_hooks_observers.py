"""Hooks (spec §7) with durable interactive approvals, and observers (spec §8), on a real server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.client import WorkflowQueryFailedError
from temporalio.service import RPCError

from tests.conftest import StackFactory
from tooltrail import (
    AlwaysRecoverable,
    ConfigurationError,
    Host,
    RetryForever,
    RunConfig,
    ToolCall,
    tool,
)
from tooltrail.core.hooks import Allow, Ask, Block, PostToolUseContext, PreToolUseContext
from tooltrail.pipeline.observers import ObservedEvent

ran: list[str] = []


@tool
def touch(name: str = "x") -> str:
    """Record that the body ran."""
    ran.append(name)
    return f"touched {name}"


@pytest.fixture(autouse=True)
def reset() -> None:
    ran.clear()


class Decide:
    def __init__(self, verdict: Any) -> None:
        self.verdict = verdict
        self.seen: list[PreToolUseContext] = []

    async def pre_tool(self, ctx: PreToolUseContext) -> Any:
        self.seen.append(ctx)
        if isinstance(self.verdict, Exception):
            raise self.verdict
        return self.verdict


class PostRecorder:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[PostToolUseContext] = []

    async def post_tool(self, ctx: PostToolUseContext) -> None:
        self.seen.append(ctx)
        if self.fail:
            raise RuntimeError("post hook broke")


async def test_block_refuses_without_running_and_skips_post_hooks(stack: StackFactory) -> None:
    post = PostRecorder()
    host = Host([touch], hooks=[Decide(Block("no")), post], reflector=AlwaysRecoverable())
    async with stack(host) as tt:
        turn = await tt.run_turn(
            [ToolCall("c", "touch", {})], session_id="s", config=RunConfig(recovery=RetryForever())
        )
        events = await tt.audit(turn.turn_id)
    result = turn.results[0]
    assert (result.output, result.is_error, result.duration_ms, result.resolved_tool_name) == (
        "no",
        True,
        0.0,
        "touch",
    )
    assert ran == [] and post.seen == []
    kinds = [e.kind for e in events if e.tool_call_id == "c"]
    assert kinds == ["tool_call_received", "tool_pre", "hook_decision", "tool_post"]
    decision = next(e for e in events if e.kind == "hook_decision")
    assert decision.payload == {"decision": "block", "hook": "Decide#0", "text": "no"}


async def test_ask_in_a_headless_session(stack: StackFactory) -> None:
    async with stack(Host([touch], hooks=[Decide(Ask("sure?"))])) as tt:
        turn = await tt.run_turn([ToolCall("c", "touch", {})], session_id="s")
    assert turn.results[0].output == (
        "Hook requested confirmation (sure?) but the session is not interactive"
    )
    assert ran == []


async def test_first_block_wins_and_allow_passes(stack: StackFactory) -> None:
    first, second, third = Decide(Allow()), Decide(Block("second says no")), Decide(Block("3"))
    async with stack(Host([touch], hooks=[first, Decide(None), second, third])) as tt:
        turn = await tt.run_turn([ToolCall("c", "touch", {"name": "n"})], session_id="s")
    assert turn.results[0].output == "second says no"
    assert third.seen == [], "later hooks do not run"
    ctx = first.seen[0]
    assert (ctx.tool_name, ctx.input, ctx.session_id, ctx.tool_call_id) == (
        "touch",
        {"name": "n"},
        "s",
        "c",
    )


async def test_a_raising_pre_hook_blocks_with_a_clear_reason(stack: StackFactory) -> None:
    async with stack(Host([touch], hooks=[Decide(RuntimeError("kaboom"))])) as tt:
        turn = await tt.run_turn([ToolCall("c", "touch", {})], session_id="s")
    assert turn.results[0].output == "hook error (RuntimeError): kaboom"
    assert ran == []


async def test_post_hooks_see_results_and_their_errors_are_ignored(stack: StackFactory) -> None:
    good, broken = PostRecorder(), PostRecorder(fail=True)
    async with stack(Host([touch], hooks=[broken, good])) as tt:
        turn = await tt.run_turn([ToolCall("c", "touch", {"name": "p"})], session_id="s")
        events = await tt.audit(turn.turn_id)
    assert turn.results[0].output == "touched p" and not turn.results[0].is_error
    ctx = good.seen[0]
    assert (ctx.tool_name, ctx.output, ctx.is_error, ctx.input) == (
        "touch",
        "touched p",
        False,
        {"name": "p"},
    )
    assert isinstance(ctx.duration_ms, int)
    post = next(e for e in events if e.kind == "tool_post")
    assert post.payload["post_hook_errors"] == ["PostRecorder#0: RuntimeError: post hook broke"]


INTERACTIVE = RunConfig(interactive=True, approval_timeout_s=60)


async def wait_parked(handle: Any) -> list[Any]:
    for _ in range(400):
        try:
            pending = await handle.pending_approvals()
        except (RPCError, WorkflowQueryFailedError):
            # Before the first workflow task the query may fail on a loaded machine.
            pending = []
        if pending:
            return pending
        await asyncio.sleep(0.05)
    pytest.fail("the call never parked")


async def test_interactive_ask_waits_for_an_approval(stack: StackFactory) -> None:
    async with stack(Host([touch], hooks=[Decide(Ask("delete it?"))])) as tt:
        handle = await tt.start_turn(
            [ToolCall("c", "touch", {"name": "approved"})], session_id="s", config=INTERACTIVE
        )
        pending = await wait_parked(handle)
        assert [(p.tool_call_id, p.tool_name, p.question) for p in pending] == [
            ("c", "touch", "delete it?")
        ]
        with pytest.raises(ConfigurationError, match="'other' is not waiting for approval"):
            await handle.approve("other", by="alice")
        await handle.approve("c", by="alice")
        turn = await handle.result()
        events = await tt.audit(turn.turn_id)
    assert turn.results[0].output == "touched approved" and ran == ["approved"]
    decision = next(e for e in events if e.kind == "hook_decision")
    assert decision.payload["outcome"] == "approved" and decision.payload["by"] == "alice"


async def test_interactive_ask_denied(stack: StackFactory) -> None:
    async with stack(Host([touch], hooks=[Decide(Ask("delete it?"))])) as tt:
        handle = await tt.start_turn(
            [ToolCall("c", "touch", {})], session_id="s", config=INTERACTIVE
        )
        await wait_parked(handle)
        await handle.deny("c", "not on a Friday", by="bob")
        turn = await handle.result()
        events = await tt.audit(turn.turn_id)
    assert (turn.results[0].output, turn.results[0].is_error) == ("not on a Friday", True)
    assert ran == []
    decision = next(e for e in events if e.kind == "hook_decision")
    assert (decision.payload["outcome"], decision.payload["by"]) == ("denied", "bob")


async def test_interactive_ask_times_out_to_the_headless_text(stack: StackFactory) -> None:
    config = RunConfig(interactive=True, approval_timeout_s=0.5)
    async with stack(Host([touch], hooks=[Decide(Ask("sure?"))])) as tt:
        turn = await tt.run_turn([ToolCall("c", "touch", {})], session_id="s", config=config)
    assert turn.results[0].output == (
        "Hook requested confirmation (sure?) but the session is not interactive"
    )


class Watcher:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.events: list[ObservedEvent] = []

    async def on_event(self, event: ObservedEvent) -> None:
        self.events.append(event)

    async def on_tool_post(self, event: ObservedEvent) -> None:
        if self.fail:
            raise RuntimeError("observer broke")


async def test_observers_get_the_stream_in_order(stack: StackFactory) -> None:
    broken, watcher = Watcher(fail=True), Watcher()
    async with stack(Host([touch], observers=[broken, watcher])) as tt:
        turn = await tt.run_turn(
            [ToolCall("a", "touch", {}), ToolCall("g", "ghost", {}), ToolCall("b", "touch", {})],
            session_id="s",
        )
        trail = await tt.audit(turn.turn_id)
    seqs = [e.seq for e in watcher.events]
    assert seqs == sorted(seqs) and sorted(set(seqs)) == [e.seq for e in trail]
    first = {}
    for event in watcher.events:
        first.setdefault(event.event_id, event)
    assert [e.kind for e in first.values()] == [e.kind for e in trail]
    assert {e.event_id for e in watcher.events} == {f"{turn.turn_id}:{e.seq}" for e in trail}
    kinds = [e.kind for e in first.values()]
    assert kinds.index("tool_pre") > max(
        i for i, k in enumerate(kinds) if k == "tool_call_received"
    )
    assert kinds.count("turn_end") == 1
    assert [e.tool_call_id for e in first.values() if e.kind == "tool_call_received"] == [
        "a",
        "g",
        "b",
    ]
    assert len(broken.events) == len(watcher.events), "a raising observer still gets every event"


async def test_observers_keep_seq_order_in_parallel_waves(stack: StackFactory) -> None:
    @tool(concurrent_safe=True)
    async def nap(ms: int) -> str:
        await asyncio.sleep(ms / 1000)
        return "ok"

    watcher = Watcher()
    async with stack(Host([nap], observers=[watcher])) as tt:
        await tt.run_turn(
            [ToolCall(f"c{i}", "nap", {"ms": (i * 37) % 100}) for i in range(8)],
            session_id="s",
            config=RunConfig(dispatch="parallel", max_concurrency=4),
        )
    first_seen: list[int] = []
    for event in watcher.events:
        if event.seq not in first_seen:
            first_seen.append(event.seq)
    assert first_seen == sorted(first_seen)
