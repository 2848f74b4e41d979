"""An attacker with namespace access only, against the hooks, the approvals and the trail.

They run their own workflow on their own task queue, with their own worker, and schedule
tooltrail's activities on tooltrail's queue with inputs they wrote; they copy what they read
in histories. Real Temporal dev server, SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.common import RawValue, RetryPolicy, WorkflowIDReusePolicy
from temporalio.converter import DataConverter
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.conftest import StackFactory
from tooltrail import Host, RunConfig, ToolCall, tool
from tooltrail.core.hooks import Ask, PreToolUseContext
from tooltrail.core.signatures import ApprovalStatement, arguments_digest
from tooltrail.core.wire import (
    APPROVAL_PROOF,
    AUDIT_RECORD,
    TOOL_EXECUTE,
    ApprovalInput,
    AuditEvent,
    ExecuteAttempt,
    Flush,
    RecordTurn,
)
from tooltrail.db.store import AuditStore
from tooltrail.ops.approver_keys import generate_approver_key, public_key_text, sign_statement

paid: list[dict[str, Any]] = []


@tool(timeout_s=30)
def pay(to: str, amount: float) -> str:
    """Move money."""
    paid.append({"to": to, "amount": amount})
    return f"paid {amount} to {to}"


class AskEveryTime:
    async def pre_tool(self, ctx: PreToolUseContext) -> Ask:
        return Ask(f"pay {ctx.input.get('amount')} to {ctx.input.get('to')}?")


ALICE = generate_approver_key()
APPROVERS = {"alice": public_key_text(ALICE)}
INTERACTIVE = RunConfig(interactive=True, approval_timeout_s=120)
TRANSFER = {"to": "mallory", "amount": 10000.0}


@pytest.fixture(autouse=True)
def reset() -> None:
    paid.clear()


@workflow.defn(name="Intruder", sandboxed=False)
class Intruder:
    """The attacker's own workflow: one activity of tooltrail's, on tooltrail's queue."""

    @workflow.run
    async def run(self, order: dict[str, Any]) -> Any:
        return await workflow.execute_activity(
            order["activity"],
            order["input"],
            task_queue=order["queue"],
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )


async def intrude(client: Client, activity: str, queue: str, inp: dict[str, Any]) -> Any:
    """Run ``activity`` on tooltrail's ``queue`` from the attacker's workflow and queue."""
    # The attacker's own client: Temporal's default converter, no codec.
    theirs = Client(client.service_client, namespace=client.namespace)
    own_queue = f"intruder-{uuid.uuid4()}"
    async with Worker(theirs, task_queue=own_queue, workflows=[Intruder]):
        return await theirs.execute_workflow(
            Intruder.run,
            {"activity": activity, "queue": queue, "input": inp},
            id=f"intruder-{uuid.uuid4()}",
            task_queue=own_queue,
        )


def attempt(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "session_id": "victim",
        "tool_call_id": "c1",
        "tool_name": "pay",
        "arguments": TRANSFER,
        "skip_pre_hooks": True,
    }
    fields.update(changes)
    return ExecuteAttempt.model_validate(fields).model_dump(mode="json")


async def wait_parked(handle: Any, call_id: str) -> None:
    for _ in range(600):
        try:
            pending = await handle.pending_approvals()
        except RPCError:
            pending = []
        if any(p.tool_call_id == call_id for p in pending):
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"{call_id} never parked")


async def scheduled_inputs(client: Client, workflow_id: str) -> list[dict[str, Any]]:
    """The inputs of the tool attempts a turn scheduled, as its history holds them."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    converter = DataConverter.default
    found = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            if attributes.activity_type.name == TOOL_EXECUTE:
                (value,) = await converter.decode(attributes.input.payloads, [dict])
                found.append(value)
    return found


async def test_a_foreign_workflow_cannot_skip_the_hooks_with_a_flag(
    stack: StackFactory, temporal_env: WorkflowEnvironment
) -> None:
    """``skip_pre_hooks: true`` from the attacker's workflow: the hooks run, the body does not
    (before: the transfer ran with no hook, no approval and no record)."""
    host = Host([pay], hooks=[AskEveryTime()])
    async with stack(host) as tt:
        outcome = await intrude(temporal_env.client, TOOL_EXECUTE, tt.task_queue, attempt())
    assert paid == []
    assert outcome["kind"] == "hook_refused"
    assert outcome["hook"]["decision"] == "ask"


async def test_a_proof_copied_from_a_history_is_worth_nothing_elsewhere(
    stack: StackFactory, temporal_env: WorkflowEnvironment
) -> None:
    """A real approval's proof, read from the turn's history, in the attacker's input: it
    is bound to that turn's workflow and run, which the server names, so the hooks run."""
    host = Host([pay], hooks=[AskEveryTime()])
    async with stack(host) as tt:
        handle = await tt.start_turn(
            [ToolCall("c1", "pay", TRANSFER)], session_id="victim", config=INTERACTIVE
        )
        await wait_parked(handle, "c1")
        await handle.approve("c1", by="alice")
        result = await handle.result()
        assert result.results[0].output == "paid 10000.0 to mallory"
        assert len(paid) == 1
        approved = [
            i
            for i in await scheduled_inputs(temporal_env.client, handle.turn_id)
            if i.get("skip_pre_hooks")
        ]
        assert len(approved) == 1 and approved[0]["approval_proof"]
        copied = attempt(approval_proof=approved[0]["approval_proof"], turn_id=handle.turn_id)
        outcome = await intrude(temporal_env.client, TOOL_EXECUTE, tt.task_queue, copied)
    assert len(paid) == 1
    assert outcome["kind"] == "hook_refused"


@pytest.mark.parametrize("activity", [AUDIT_RECORD, APPROVAL_PROOF])
async def test_a_foreign_workflow_cannot_write_the_trail_or_take_up_approvals(
    stack: StackFactory, temporal_env: WorkflowEnvironment, db_url: str, activity: str
) -> None:
    """tooltrail's local-only activities refuse a regular task (before: the attacker's
    records landed in the victim turn's trail)."""
    forged = Flush(
        turn_id="victim-turn",
        session_id="victim",
        events=[
            AuditEvent(
                seq=0,
                kind="tool_post",
                tool_call_id="c1",
                tool_name="pay",
                payload={"output": "nothing happened here"},
                created_at=datetime.now(UTC),
            )
        ],
    )
    inputs = {
        AUDIT_RECORD: RecordTurn(flush=forged).model_dump(mode="json"),
        APPROVAL_PROOF: {"tool_call_id": "c1", "arguments_sha256": arguments_digest(TRANSFER)},
    }
    async with stack(Host([pay]), database_url=db_url) as tt:
        with pytest.raises(WorkflowFailureError) as failed:
            await intrude(temporal_env.client, activity, tt.task_queue, inputs[activity])
    cause = failed.value.cause
    assert isinstance(cause, ActivityError)
    assert isinstance(cause.cause, ApplicationError)
    assert cause.cause.type == "NotALocalActivity"
    assert "runs only as a local activity of tooltrail's own workflows" in cause.cause.message
    store = AuditStore(db_url)
    try:
        assert await store.events("victim-turn", all_runs=True) == []
    finally:
        await store.close()


async def test_a_copied_approval_does_not_run_the_call_again_in_a_new_run(
    stack: StackFactory, temporal_env: WorkflowEnvironment, db_url: str
) -> None:
    """The attacker copies a turn's start input and its accepted approval Update (raw
    payloads, no keys), starts a new run of the same workflow id and sends the Update:
    the transfer does not run a second time (before: it did, and verify said ok)."""
    host = Host([pay], hooks=[AskEveryTime()], approvers=APPROVERS)
    client = temporal_env.client
    async with stack(host, database_url=db_url) as tt:
        handle = await tt.start_turn(
            [ToolCall("c1", "pay", TRANSFER)], session_id="victim", config=INTERACTIVE
        )
        await wait_parked(handle, "c1")
        # A statement that names no run (as a signing service may make): only the
        # single-use record across runs stands between it and a second transfer.
        statement = ApprovalStatement(
            approver="alice",
            turn_id=handle.turn_id,
            tool_call_id="c1",
            arguments_sha256=arguments_digest(TRANSFER),
            decision="approve",
            expires_at=datetime.now(UTC) + timedelta(minutes=5),
        )
        await handle.submit_approval(
            ApprovalInput(tool_call_id="c1", approved=True, signed=sign_statement(statement, ALICE))
        )
        await handle.result()
        assert len(paid) == 1

        history = await client.get_workflow_handle(handle.turn_id).fetch_history()
        start = update = None
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                start = event.workflow_execution_started_event_attributes.input.payloads[0]
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
                accepted = event.workflow_execution_update_accepted_event_attributes
                update = accepted.accepted_request.input.args.payloads[0]
        assert start is not None and update is not None

        theirs = Client(client.service_client, namespace=client.namespace)
        replay = await theirs.start_workflow(
            "TurnWorkflow",
            RawValue(start),
            id=handle.turn_id,
            task_queue=tt.task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        )
        await wait_parked(tt.get_turn(handle.turn_id), "c1")
        await replay.execute_update("approval", RawValue(update))
        again = await tt.get_turn(handle.turn_id).result()
    assert len(paid) == 1
    assert again.results[0].is_error
    assert "this signed approval was already used" in again.results[0].output


async def test_a_statement_bound_to_its_run_is_refused_in_a_new_run(
    stack: StackFactory, temporal_env: WorkflowEnvironment
) -> None:
    """``approve --key`` (``TurnHandle.approve``) names the run: in a new run of the same id
    the copied Update is refused by the validator, before anything enters the history."""
    host = Host([pay], hooks=[AskEveryTime()], approvers=APPROVERS)
    client = temporal_env.client
    async with stack(host) as tt:
        handle = await tt.start_turn(
            [ToolCall("c1", "pay", TRANSFER)], session_id="victim", config=INTERACTIVE
        )
        await wait_parked(handle, "c1")
        await handle.approve("c1", by="alice", key=ALICE)
        await handle.result()
        history = await client.get_workflow_handle(handle.turn_id).fetch_history()
        start = update = None
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                start = event.workflow_execution_started_event_attributes.input.payloads[0]
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
                accepted = event.workflow_execution_update_accepted_event_attributes
                update = accepted.accepted_request.input.args.payloads[0]
        assert start is not None and update is not None
        replay = await client.start_workflow(
            "TurnWorkflow",
            RawValue(start),
            id=handle.turn_id,
            task_queue=tt.task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        )
        await wait_parked(tt.get_turn(handle.turn_id), "c1")
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await replay.execute_update("approval", RawValue(update))
        assert "the approval is for run" in str(refused.value.__cause__ or refused.value)
        await replay.cancel()
    assert len(paid) == 1


async def test_a_worker_without_a_key_refuses_approvals_with_one_clear_line(
    stack: StackFactory,
) -> None:
    host = Host([pay], hooks=[AskEveryTime()], worker_keys={})
    async with stack(host) as tt:
        handle = await tt.start_turn(
            [ToolCall("c1", "pay", TRANSFER)], session_id="victim", config=INTERACTIVE
        )
        await wait_parked(handle, "c1")
        await handle.approve("c1", by="alice")
        result = await handle.result()
    assert paid == []
    assert result.results[0].is_error
    assert "this worker holds no worker key (TOOLTRAIL_WORKER_KEY)" in result.results[0].output
