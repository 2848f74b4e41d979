"""Recovery, the retry ceiling and cancellation as durable workflow logic (spec §6, §9.5).

Timer-heavy scenarios run on Temporal's time-skipping server; cancellation scenarios that
need real time run on the dev server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tests.support.stand_ins import PonderingReflector
from tooltrail import (
    AlwaysRecoverable,
    Analysis,
    ExponentialBackoff,
    FixedDelay,
    Host,
    InputFix,
    ReflectionContext,
    RetryForever,
    RunConfig,
    ToolCall,
    ToolChange,
    ToolContext,
    ToolError,
    ToolRecoveryExhausted,
    Tooltrail,
    TurnCancelled,
    tool,
)
from tooltrail.core.wire import RECOVERY_REFLECT, TOOL_EXECUTE

runs: Counter[str] = Counter()
seen_inputs: list[dict[str, Any]] = []


@tool
def flaky(path: str = "/bad") -> str:
    """Fail every time, numbering the executions."""
    runs["flaky"] += 1
    seen_inputs.append({"path": path})
    raise ToolError(f"failure #{runs['flaky']}")


@tool
def a() -> str:
    """Always fail."""
    runs["a"] += 1
    raise ToolError("a failed")


@tool
def b() -> str:
    """Always fail."""
    runs["b"] += 1
    raise ToolError("b failed")


@pytest.fixture(autouse=True)
def reset() -> None:
    runs.clear()
    seen_inputs.clear()


async def history_of(tt: Tooltrail, turn_id: str) -> Any:
    return await tt.client.get_workflow_handle(turn_id).fetch_history()


def activities(history: Any, name: str) -> int:
    return sum(
        1
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == name
    )


def timers_ms(history: Any) -> list[float]:
    return [
        e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds() * 1000
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
    ]


class Scripted:
    """A reflector answering with a fixed analysis (and recording what it was asked)."""

    def __init__(self, **analysis: Any) -> None:
        self.analysis = analysis
        self.asked: list[ReflectionContext] = []

    async def analyze(self, ctx: ReflectionContext) -> Analysis:
        self.asked.append(ctx)
        return Analysis(is_recoverable=True, root_cause=ctx.error, **self.analysis)


async def test_default_configuration_runs_a_failing_call_once(stack: StackFactory) -> None:
    async with stack(Host([flaky])) as tt:
        turn = await tt.run_turn([ToolCall("c", "flaky", {})], session_id="s")
        history = await history_of(tt, turn.turn_id)
        events = await tt.audit(turn.turn_id)
    assert (turn.results[0].output, turn.results[0].is_error) == ("failure #1", True)
    assert runs["flaky"] == 1
    assert activities(history, TOOL_EXECUTE) == 1
    assert activities(history, RECOVERY_REFLECT) == 0, "the no-op reflector costs no round trip"
    decision = next(e for e in events if e.kind == "recovery_decision")
    assert decision.payload["action"] == {"kind": "fail", "reason": "failure #1"}


async def test_recoverable_failure_backs_off_100_200_400_then_fails_softly(
    stack: StackFactory, time_skipping_env: WorkflowEnvironment
) -> None:
    async with stack(Host([flaky], reflector=AlwaysRecoverable()), env=time_skipping_env) as tt:
        turn = await tt.run_turn([ToolCall("c", "flaky", {})], session_id="s")
        history = await history_of(tt, turn.turn_id)
        events = await tt.audit(turn.turn_id)
    result = turn.results[0]
    assert (result.output, result.is_error, result.tool_call_id) == ("failure #4", True, "c")
    assert runs["flaky"] == 4
    assert timers_ms(history) == [100, 200, 400]
    assert [e.attempt for e in events if e.kind == "tool_pre"] == [0, 1, 2, 3]
    assert [e.kind for e in events if e.tool_call_id == "c"][1:] == [
        "tool_pre",
        "tool_post",
        "recovery_decision",
    ] * 4
    decisions = [e.payload["action"] for e in events if e.kind == "recovery_decision"]
    assert decisions == [
        {"kind": "retry", "delay_ms": 100},
        {"kind": "retry", "delay_ms": 200},
        {"kind": "retry", "delay_ms": 400},
        {"kind": "fail", "reason": "max retries (3) exceeded"},
    ]


async def test_retry_forever_hits_the_ceiling_after_six_executions(
    stack: StackFactory, time_skipping_env: WorkflowEnvironment
) -> None:
    config = RunConfig(recovery=RetryForever())
    async with stack(Host([flaky], reflector=AlwaysRecoverable()), env=time_skipping_env) as tt:
        handle = await tt.start_turn([ToolCall("c", "flaky", {})], session_id="s", config=config)
        with pytest.raises(ToolRecoveryExhausted) as raised:
            await handle.result()
        history = await history_of(tt, handle.turn_id)
        events = await tt.audit(handle.turn_id)
        row = await tt.store.turn(handle.turn_id)
    assert (raised.value.tool, raised.value.attempts) == ("flaky", 6)
    assert runs["flaky"] == 6
    assert timers_ms(history) == [], "a zero delay creates no timer"
    failed = next(
        e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED
    )
    info = failed.workflow_execution_failed_event_attributes.failure.application_failure_info
    assert (info.type, info.non_retryable) == ("ToolRecoveryExhausted", True)
    assert row is not None and row.status == "failed" and row.error_type == "ToolRecoveryExhausted"
    assert events[-1].kind == "turn_end" and events[-1].payload["success"] is False


async def test_tool_change_keeps_the_original_name_in_the_exhaustion_error(
    stack: StackFactory, time_skipping_env: WorkflowEnvironment
) -> None:
    reflector = Scripted(correction=ToolChange("b"))
    config = RunConfig(recovery=RetryForever())
    async with stack(Host([a, b], reflector=reflector), env=time_skipping_env) as tt:
        handle = await tt.start_turn([ToolCall("c", "a", {})], session_id="s", config=config)
        with pytest.raises(ToolRecoveryExhausted) as raised:
            await handle.result()
        events = await tt.audit(handle.turn_id)
    assert (raised.value.tool, raised.value.attempts) == ("a", 6)
    assert (runs["a"], runs["b"]) == (1, 5)
    pres = [e for e in events if e.kind == "tool_pre"]
    assert [e.payload["tool"] for e in pres] == ["a", "b", "b", "b", "b", "b"]
    assert {e.tool_call_id for e in pres} == {"c"}
    assert reflector.asked[0].schema_ == {"properties": {}, "type": "object"}


async def test_input_fix_reaches_the_tool_under_the_same_call_id(
    stack: StackFactory, time_skipping_env: WorkflowEnvironment
) -> None:
    reflector = Scripted(correction=InputFix({"path": "/ok"}))
    config = RunConfig(recovery=FixedDelay(1, 0))
    async with stack(Host([flaky], reflector=reflector), env=time_skipping_env) as tt:
        turn = await tt.run_turn(
            [ToolCall("c", "flaky", {"path": "/x"})], session_id="s", config=config
        )
        events = await tt.audit(turn.turn_id)
    assert seen_inputs == [{"path": "/x"}, {"path": "/ok"}]
    posts = [e for e in events if e.kind == "tool_post"]
    assert [(e.tool_call_id, e.payload["input"]) for e in posts] == [
        ("c", {"path": "/x"}),
        ("c", {"path": "/ok"}),
    ]
    assert turn.results[0].tool_call_id == "c"


async def test_unusable_input_fix_retries_unchanged_and_warns(
    stack: StackFactory, time_skipping_env: WorkflowEnvironment, caplog: pytest.LogCaptureFixture
) -> None:
    reflector = Scripted(correction=InputFix("str"))
    config = RunConfig(recovery=FixedDelay(1, 0))
    async with stack(Host([flaky], reflector=reflector), env=time_skipping_env) as tt:
        with caplog.at_level(logging.WARNING):
            turn = await tt.run_turn(
                [ToolCall("c", "flaky", {"path": "/x"})], session_id="s", config=config
            )
        events = await tt.audit(turn.turn_id)
    assert seen_inputs == [{"path": "/x"}, {"path": "/x"}]
    problem = "InputFix correction modified_input must be a JSON object"
    decision = next(e for e in events if e.kind == "recovery_decision")
    assert decision.payload["correction_problem"] == problem
    assert any(
        "correction failed to produce a usable retry" in r.getMessage()
        and problem in r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
    )


class Raising:
    async def analyze(self, ctx: ReflectionContext) -> Analysis:
        raise RuntimeError("model unreachable")


async def test_a_raising_reflector_means_fail(stack: StackFactory) -> None:
    config = RunConfig(recovery=RetryForever())
    async with stack(Host([flaky], reflector=Raising())) as tt:
        turn = await tt.run_turn([ToolCall("c", "flaky", {})], session_id="s", config=config)
        events = await tt.audit(turn.turn_id)
    assert (turn.results[0].output, turn.results[0].is_error) == ("failure #1", True)
    assert runs["flaky"] == 1
    decision = next(e for e in events if e.kind == "recovery_decision")
    # Spec §6.1: Fail(error_msg), the failed attempt's own text; the event keeps the cause.
    assert decision.payload["action"] == {"kind": "fail", "reason": "failure #1"}
    assert (
        decision.payload["reflector_error"] == "reflector error (RuntimeError): model unreachable"
    )
    assert decision.payload["analysis"] is None


async def test_ask_user_returns_the_failing_output_byte_for_byte(
    stack: StackFactory, time_skipping_env: WorkflowEnvironment
) -> None:
    reflector = Scripted(severity="high", correction=ToolChange("b"))
    async with stack(Host([flaky, b], reflector=reflector), env=time_skipping_env) as tt:
        turn = await tt.run_turn([ToolCall("c", "flaky", {})], session_id="s")
        events = await tt.audit(turn.turn_id)
    assert turn.results[0].output == "failure #1"
    decision = next(e for e in events if e.kind == "recovery_decision")
    assert decision.payload["action"] == {
        "kind": "ask_user",
        "prompt": "high-severity failure with correction available: failure #1",
    }
    assert runs["b"] == 0


async def test_backoff_caps_at_30_seconds(
    stack: StackFactory, time_skipping_env: WorkflowEnvironment
) -> None:
    config = RunConfig(recovery=ExponentialBackoff(max_retries=5, base_delay_ms=10_000))
    async with stack(Host([flaky], reflector=AlwaysRecoverable()), env=time_skipping_env) as tt:
        started = time.monotonic()
        turn = await tt.run_turn([ToolCall("c", "flaky", {})], session_id="s", config=config)
        elapsed = time.monotonic() - started
        history = await history_of(tt, turn.turn_id)
    assert timers_ms(history) == [10_000, 20_000, 30_000, 30_000, 30_000]
    assert runs["flaky"] == 6
    assert elapsed < 60, "time skipping, not two minutes of waiting"


async def wait_for(predicate: Any, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_cancel_during_a_long_backoff_returns_promptly(stack: StackFactory) -> None:
    config = RunConfig(recovery=FixedDelay(3, 10_000))
    async with stack(Host([flaky], reflector=AlwaysRecoverable())) as tt:
        handle = await tt.start_turn(
            [ToolCall("c1", "flaky", {}), ToolCall("c2", "flaky", {})],
            session_id="s",
            config=config,
        )

        async def timer_started() -> bool:
            return bool(timers_ms(await history_of(tt, handle.turn_id)))

        await wait_for(timer_started)
        started = time.monotonic()
        await handle.cancel()
        with pytest.raises(TurnCancelled):
            await handle.result()
        assert time.monotonic() - started < 5
        events = await tt.audit(handle.turn_id)
        row = await tt.store.turn(handle.turn_id)
    assert runs["flaky"] == 1, "no second execution"
    cancelled = next(e for e in events if e.kind == "turn_cancelled")
    assert cancelled.payload == {"finished_calls": [], "pending_calls": ["c1", "c2"]}
    assert row is not None and row.status == "cancelled"
    assert events[-1].kind == "turn_end" and events[-1].payload["error"] == "cancelled"


async def test_cancel_while_the_reflector_judges(stack: StackFactory) -> None:
    # The cancelled reflector activity resolves as a failure: the turn must end cancelled,
    # not go on with "reflector unavailable" as the call's recovery decision.
    async with stack(Host([flaky], reflector=PonderingReflector())) as tt:
        handle = await tt.start_turn([ToolCall("c1", "flaky", {})], session_id="s")

        async def reflecting() -> bool:
            history = await history_of(tt, handle.turn_id)
            return any(
                e.activity_task_scheduled_event_attributes.activity_type.name == RECOVERY_REFLECT
                for e in history.events
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            )

        await wait_for(reflecting)
        await asyncio.sleep(0.2)
        await handle.cancel()
        with pytest.raises(TurnCancelled):
            await handle.result()
        events = await tt.audit(handle.turn_id)
        row = await tt.store.turn(handle.turn_id)
    assert row is not None and row.status == "cancelled"
    assert not [e for e in events if "reflector unavailable" in str(e.payload)]
    assert events[-1].kind == "turn_end" and events[-1].payload["error"] == "cancelled"


async def test_cancel_while_tools_run(stack: StackFactory) -> None:
    started = asyncio.Event()
    outcome: dict[str, Any] = {}

    @tool
    def quick() -> str:
        return "done"

    @tool
    async def slow_async() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            outcome["async"] = "cancelled"
            raise
        return "finished"

    config = RunConfig(heartbeat_timeout_s=1)
    async with stack(Host([quick, slow_async])) as tt:
        handle = await tt.start_turn(
            [ToolCall("c1", "quick", {}), ToolCall("c2", "slow_async", {})],
            session_id="s",
            config=config,
        )
        await asyncio.wait_for(started.wait(), 20)
        began = time.monotonic()
        await handle.cancel()
        with pytest.raises(TurnCancelled):
            await handle.result()
        assert time.monotonic() - began < 5

        async def tool_saw_it() -> bool:
            return outcome.get("async") == "cancelled"

        await wait_for(tool_saw_it, 10)
        events = await tt.audit(handle.turn_id)
    cancelled = next(e for e in events if e.kind == "turn_cancelled")
    assert cancelled.payload == {"finished_calls": ["c1"], "pending_calls": ["c2"]}
    kinds = [(e.kind, e.tool_call_id) for e in events]
    assert ("tool_pre", "c2") in kinds and ("tool_post", "c2") not in kinds


async def test_sync_tools_see_the_cancellation_flag(stack: StackFactory) -> None:
    started = asyncio.Event()
    loop = asyncio.get_running_loop()
    outcome: dict[str, Any] = {}

    @tool
    def slow_sync(ctx: ToolContext) -> str:
        loop.call_soon_threadsafe(started.set)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if ctx.cancelled:
                outcome["sync"] = "saw cancellation"
                return "stopped"
            time.sleep(0.05)
        return "finished"

    async with stack(Host([slow_sync])) as tt:
        handle = await tt.start_turn(
            [ToolCall("c", "slow_sync", {})],
            session_id="s",
            config=RunConfig(heartbeat_timeout_s=1),
        )
        await asyncio.wait_for(started.wait(), 20)
        await handle.cancel()
        with pytest.raises(TurnCancelled):
            await handle.result()

        async def flag_seen() -> bool:
            return "sync" in outcome

        await wait_for(flag_seen, 10)
