"""``@tool(local=True)``: attempts as local activities, with the same pipeline and audit trail."""

from __future__ import annotations

from collections import Counter

import pytest
from sqlalchemy import text
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from tests.conftest import StackFactory
from tests.faults.history import local_activities
from tooltrail import Host, NoRetry, RunConfig, ToolCall, ToolDefinitionError, ToolError, tool
from tooltrail.core.wire import AUDIT_RECORD, TOOL_EXECUTE, TURN_PREPARE

runs: Counter[str] = Counter()


@tool(local=True)
def upper(text: str) -> str:
    """Upper-case the text."""
    runs["upper"] += 1
    return text.upper()


@tool(local=True, concurrent_safe=True)
def double(n: int) -> int:
    """Double a number."""
    return 2 * n


@tool(local=True)
def refuses(reason: str) -> str:
    """Always fail softly."""
    runs["refuses"] += 1
    raise ToolError(reason)


@tool
def remote(text: str) -> str:
    """A regular (non-local) tool."""
    return text


def scheduled(history: WorkflowHistory) -> list[str]:
    """The activity types scheduled on the server."""
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


def local_markers(history: WorkflowHistory) -> list[str]:
    """The activity types of the local activities the history holds."""
    return [data["activity_type"] for data in local_activities(history)]


async def test_local_tool_runs_without_a_scheduled_activity(stack: StackFactory) -> None:
    async with stack(Host([upper, remote])) as tt:
        turn = await tt.run_turn(
            [
                ToolCall("c1", "upper", {"text": "qzjw local input"}),
                ToolCall("c2", "remote", {"text": "x"}),
            ],
            session_id="local-1",
        )
        history = await tt.client.get_workflow_handle(turn.turn_id).fetch_history()
        trail = [(e.kind, e.tool_call_id) for e in await tt.audit(turn.turn_id)]

    assert [(r.output, r.is_error) for r in turn.results] == [
        ("QZJW LOCAL INPUT", False),
        ("x", False),
    ]
    # The local call never went through the server's task queue; the regular one did.
    assert scheduled(history) == [TOOL_EXECUTE]
    # (The turn's plan comes first, from the worker: a local activity too.)
    assert local_markers(history) == [TURN_PREPARE, TOOL_EXECUTE, AUDIT_RECORD]
    # Its input (and the audit records riding with it) stay out of the history until the
    # regular call's activity carries the records on.
    before_remote = history.events[
        1 : history.events.index(
            next(
                e
                for e in history.events
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            )
        )
    ]
    assert before_remote
    # (A text no id or digest can contain: "abc" turned up in a random hex id once.)
    assert not any(b"qzjw local input" in e.SerializeToString() for e in before_remote)
    # The audit trail is the same as for any tool.
    assert trail == [
        ("turn_started", None),
        ("tool_call_received", "c1"),
        ("tool_call_received", "c2"),
        ("tool_pre", "c1"),
        ("tool_post", "c1"),
        ("tool_pre", "c2"),
        ("tool_post", "c2"),
        ("turn_end", None),
    ]


async def test_local_tool_failure_is_a_soft_result_with_recovery(stack: StackFactory) -> None:
    runs.clear()
    async with stack(Host([refuses])) as tt:
        turn = await tt.run_turn([ToolCall("c1", "refuses", {"reason": "no"})], session_id="l-2")
        kinds = [e.kind for e in await tt.audit(turn.turn_id)]

    assert [(r.output, r.is_error) for r in turn.results] == [("no", True)]
    assert runs["refuses"] == 1  # a tool error is a result, never an activity retry
    assert kinds.count("recovery_decision") == 1


async def test_local_tools_in_parallel_keep_the_model_order(stack: StackFactory) -> None:
    async with stack(Host([double])) as tt:
        turn = await tt.run_turn(
            [ToolCall(f"c{i}", "double", {"n": i}) for i in range(6)],
            session_id="local-3",
            config=RunConfig(dispatch="parallel", max_concurrency=3),
        )
        history = await tt.client.get_workflow_handle(turn.turn_id).fetch_history()

    assert [r.output for r in turn.results] == [str(2 * i) for i in range(6)]
    assert scheduled(history) == []
    assert local_markers(history).count(TOOL_EXECUTE) == 6


async def test_local_tool_bad_arguments_are_answered_like_any_tool(stack: StackFactory) -> None:
    async with stack(Host([upper])) as tt:
        turn = await tt.run_turn([ToolCall("c1", "upper", {})], session_id="local-4")

    (result,) = turn.results
    assert result.is_error
    assert "text" in str(result.output)


def test_local_cannot_promise_no_retry_on_interrupt() -> None:
    with pytest.raises(ToolDefinitionError, match="local=True cannot be combined"):

        @tool(local=True, retry_on_interrupt=False)
        def charge(amount: int) -> str:
            """Charge a card."""
            return str(amount)


def test_local_is_part_of_the_tool_meta() -> None:
    meta = Host([upper, remote]).tool_meta()
    assert meta["upper"].local is True
    assert meta["remote"].local is False


@tool(local=True, idempotent=True)
def charge(order: str) -> str:
    """Charge an order once (a local tool)."""
    return f"charged {order}"


@tool(idempotent=True)
def charge_remote(order: str) -> str:
    """Charge an order once (a regular tool)."""
    return f"charged {order}"


@pytest.mark.parametrize("name", ["charge", "charge_remote"])
async def test_an_attempt_out_of_infrastructure_retries_is_a_soft_failure(
    stack: StackFactory, name: str
) -> None:
    # The idempotency key cannot be claimed (its table is gone), so every try of the attempt
    # fails inside the activity: once Temporal's retries are spent, the model reads why.
    # A local activity reports that failure differently from a regular one (the application
    # error itself, not wrapped in an activity error): both must end the same way.
    config = RunConfig(infrastructure_retries=2, recovery=NoRetry())
    async with stack(Host([charge, charge_remote])) as tt:
        async with tt.store.engine.begin() as connection:
            await connection.execute(text("DROP TABLE idempotency_record"))
        turn = await tt.run_turn(
            [ToolCall("c1", name, {"order": "o-1"})], session_id=f"spent-{name}", config=config
        )
        events = await tt.audit(turn.turn_id)
        record = await tt.store.turn(turn.turn_id)
    (result,) = turn.results
    # The model reads that the database failed, never the database's text (which may quote
    # the data being written: tooltrail.runtime.clean_failures); the worker's log has the
    # whole error.
    assert result.is_error
    assert "database error in tooltrail.tool.execute: OperationalError" in result.output
    assert events[-1].kind == "turn_end" and events[-1].payload["success"] is True
    assert record is not None and record.status == "completed"
