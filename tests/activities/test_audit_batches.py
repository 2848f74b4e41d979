"""Audit records in batches: written by local activities, never carried in the history."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from tests.conftest import StackFactory
from tests.faults.history import local_activities
from tooltrail import (
    AlwaysRecoverable,
    FixedDelay,
    Host,
    LoopDetection,
    RunConfig,
    ToolCall,
    ToolError,
    tool,
)
from tooltrail.activities.tool_execution import Recorder
from tooltrail.core.wire import AUDIT_RECORD, AuditEvent, Flush, TurnRecord
from tooltrail.db.store import AuditStore

failures = {"left": 0}


@tool
async def nap(ms: int) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(ms / 1000)
    return f"slept {ms}"


@tool
def wobbly() -> str:
    """Fail while ``failures["left"]`` lasts."""
    if failures["left"] > 0:
        failures["left"] -= 1
        raise ToolError("not yet")
    return "steady"


def audit_writes(history: WorkflowHistory) -> int:
    """How many audit batches the turn wrote (local activity markers)."""
    return sum(data["activity_type"] == AUDIT_RECORD for data in local_activities(history))


def activity_inputs(history: WorkflowHistory) -> bytes:
    return b"".join(
        p.data
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        for p in e.activity_task_scheduled_event_attributes.input.payloads
    )


async def test_a_fast_turn_writes_its_trail_once_at_the_end(stack: StackFactory) -> None:
    async with stack(Host([nap])) as tt:
        turn = await tt.run_turn(
            [ToolCall(f"c{i}", "nap", {"ms": 0}) for i in range(5)], session_id="b-1"
        )
        history = await tt.client.get_workflow_handle(turn.turn_id).fetch_history()
        events = await tt.audit(turn.turn_id)
    assert audit_writes(history) == 1
    # No record rides in a tool activity's input: the history holds each call once.
    assert b"tool_pre" not in activity_inputs(history)
    assert [e.seq for e in events] == list(range(len(events)))
    assert [e.kind for e in events].count("tool_post") == 5


async def test_a_running_turn_shows_its_trail_after_the_interval(stack: StackFactory) -> None:
    async with stack(Host([nap])) as tt:
        handle = await tt.start_turn(
            [ToolCall("c1", "nap", {"ms": 600}), ToolCall("c2", "nap", {"ms": 4000})],
            session_id="b-2",
            config=RunConfig(audit_interval_s=0.5),
        )
        # c2 starts 0.6 s into the turn, past the interval: a batch goes first, so c1's
        # result is in the database while c2 still runs.
        for _ in range(60):
            kinds = [(e.kind, e.tool_call_id) for e in await tt.audit(handle.turn_id)]
            if ("tool_post", "c1") in kinds:
                break
            await asyncio.sleep(0.05)
        assert ("tool_post", "c1") in kinds
        assert ("tool_pre", "c2") in kinds
        assert ("tool_post", "c2") not in kinds
        record = await tt.store.turn(handle.turn_id)
        assert record is not None and record.status == "running"
        await handle.result()


async def test_the_trail_is_complete_while_a_backoff_timer_waits(stack: StackFactory) -> None:
    failures["left"] = 1
    config = RunConfig(recovery=FixedDelay(2, 3000))
    async with stack(Host([wobbly], reflector=AlwaysRecoverable())) as tt:
        handle = await tt.start_turn(
            [ToolCall("c1", "wobbly", {})], session_id="b-3", config=config
        )
        for _ in range(60):
            kinds = [e.kind for e in await tt.audit(handle.turn_id)]
            if "recovery_decision" in kinds:
                break
            await asyncio.sleep(0.05)
        assert kinds[-3:] == ["tool_pre", "tool_post", "recovery_decision"]
        turn = await handle.result()
    assert turn.results[0].output == "steady"


async def test_many_events_make_a_batch_without_waiting_for_the_interval(
    stack: StackFactory,
) -> None:
    async with stack(Host([nap])) as tt:
        turn = await tt.run_turn(
            [ToolCall(f"c{i}", "nap", {"ms": 0}) for i in range(80)],
            session_id="b-4",
            config=RunConfig(audit_interval_s=3600, detection=LoopDetection(enabled=False)),
        )
        history = await tt.client.get_workflow_handle(turn.turn_id).fetch_history()
        events = await tt.audit(turn.turn_id)
    # 1 + 80 + 2 x 80 + 1 events: a batch at 200 pending, the rest at the end.
    assert len(events) == 242
    assert audit_writes(history) == 2
    assert [e.seq for e in events] == list(range(242))


@tool
def bulky(n: int) -> str:
    """Return about 150 KB of text."""
    return f"{n}:" + "x" * 150_000


async def test_a_final_write_too_big_for_one_batch_goes_in_several(stack: StackFactory) -> None:
    # Four outputs of ~150 KB stay pending until the end (interval never reached); one
    # batch carries at most 256 KB, so the final write takes several, the status last.
    async with stack(Host([bulky])) as tt:
        turn = await tt.run_turn(
            [ToolCall(f"c{i}", "bulky", {"n": i}) for i in range(4)],
            session_id="b-5",
            config=RunConfig(audit_interval_s=3600),
        )
        history = await tt.client.get_workflow_handle(turn.turn_id).fetch_history()
        events = await tt.audit(turn.turn_id)
        record = await tt.store.turn(turn.turn_id)
    assert audit_writes(history) >= 3
    assert [e.seq for e in events] == list(range(len(events)))
    posts = [e for e in events if e.kind == "tool_post"]
    assert [len(e.payload["output"]) for e in posts] == [150_002] * 4
    assert events[-1].kind == "turn_end"
    assert record is not None and (record.status, record.call_count) == ("completed", 4)


async def test_a_failed_batch_pauses_the_workers_next_batches(sqlite_url: str) -> None:
    # A database nobody answers at (port 1: refused at once) stands for one that is down.
    down = AuditStore("postgresql+asyncpg://postgres@127.0.0.1:1/none")
    up = AuditStore(sqlite_url)
    recorder = Recorder(down, batch_pause_s=(0.5, 1.0))
    flush = Flush(
        turn_id="paused-batches",
        session_id="s",
        turn=TurnRecord(turn_id="paused-batches", session_id="s", started_at=datetime.now(UTC)),
        events=[AuditEvent(seq=0, kind="turn_started", payload={}, created_at=datetime.now(UTC))],
    )
    try:
        assert await recorder.write_chained(flush) is False
        assert recorder.batches_paused
        # Paused: not even tried, so a working database changes nothing until the pause ends.
        recorder.store = up
        assert await recorder.write_chained(flush) is False
        assert await up.events("paused-batches") == []
        await asyncio.sleep(0.6)
        assert not recorder.batches_paused
        # Failing again after the pause: the next pause is twice as long.
        recorder.store = down
        assert await recorder.write_chained(flush) is False
        await asyncio.sleep(0.6)
        assert recorder.batches_paused
        # The turn's final write is never paused, and its success ends a pause.
        recorder.store = up
        assert isinstance(await recorder.write_chained(flush, must_persist=True), str)
        assert not recorder.batches_paused
        assert isinstance(await recorder.write_chained(flush), str)  # the chain's head
        assert [e.seq for e in await up.events("paused-batches")] == [0]
    finally:
        await down.close()
        await up.close()
