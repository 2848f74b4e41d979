"""Every turn that ends by its own code anchors its trail's head; verify catches a cut trail.

Completed turns anchor the head in their result, failed and cancelled ones in their memo
(``TRAIL_HEAD_MEMO``), agent runs' turns alike. Real Temporal, SQLite and PostgreSQL, with
and without the payload codec.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, func, select
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tests.ops.test_encrypted_ops import KEYS, running
from tests.runtime.test_reconcile import HOST, echo, running_turn, until_status
from tests.support.cli_runner import run_cli
from tooltrail import Host, LoopDetected, RunConfig, ToolCall, Tooltrail
from tooltrail.core.detection import LoopDetection
from tooltrail.core.wire import TRAIL_HEAD_MEMO
from tooltrail.db.orm import AuditEventRow
from tooltrail.llm.scripted import ScriptedModel, tool_call_response
from tooltrail.ops.verify import _trail_head, verify_turn
from tooltrail.runtime.worker import settings_data_converter
from tooltrail.settings import Settings

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
CUT = "the chain's last record is not its head: records were cut off or added at its end"


async def failed_turn(tt: Tooltrail) -> str:
    """A turn the loop detector stops (``LoopDetected``): it fails, with a whole trail."""
    turn_id = f"turn-{uuid.uuid4()}"
    with pytest.raises(LoopDetected):
        await tt.run_turn(
            [ToolCall(f"c{i}", "echo", {"text": "again"}) for i in range(3)],
            session_id=f"loop-{uuid.uuid4()}",
            config=RunConfig(detection=LoopDetection(loop_threshold=1, stop_threshold=2)),
            turn_id=turn_id,
        )
    return turn_id


async def cut_last_record(tt: Tooltrail, turn_id: str) -> int:
    """Delete the turn's last record, as someone covering its end up in SQL would."""
    async with tt.store.sessions.begin() as session:
        last = await session.scalar(
            select(func.max(AuditEventRow.seq)).where(AuditEventRow.turn_id == turn_id)
        )
        assert last is not None
        await session.execute(
            delete(AuditEventRow).where(AuditEventRow.turn_id == turn_id, AuditEventRow.seq == last)
        )
    return int(last)


async def assert_anchored_and_cut_caught(tt: Tooltrail, turn_id: str, anchor: str) -> None:
    report = await tt.verify(turn_id)
    assert report.ok and report.checkable, report.problems
    assert report.anchor == anchor
    await cut_last_record(tt, turn_id)
    report = await tt.verify(turn_id)
    assert report.checkable and not report.ok
    # Nothing else tells of the cut: the chain is whole up to its new end, seq has no hole.
    assert [p.kind for p in report.problems] == ["chain_broken"], report.problems
    assert CUT in report.problems[0].detail


async def test_a_failed_turn_anchors_its_head_in_the_memo(
    stack: StackFactory, db_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        turn_id = await failed_turn(tt)
        description = await tt.client.get_workflow_handle(turn_id).describe()
        assert description.status == WorkflowExecutionStatus.FAILED
        report = await tt.verify(turn_id)
        assert report.temporal_status == report.trail_status == "failed"
        # The memo holds the head of the trail as written, readable by any client.
        events = await tt.audit(turn_id)
        assert await description.memo_value(TRAIL_HEAD_MEMO, type_hint=str) == events[-1].digest
        assert events[-1].kind == "turn_end"
        await assert_anchored_and_cut_caught(tt, turn_id, "memo")

    # The command line lists the problem and exits 1.
    address = temporal_env.client.service_client.config.target_host
    args = ["audit", "verify", turn_id, "--temporal-address", address, "--database-url", db_url]
    done = await asyncio.to_thread(run_cli, args, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "MISMATCH" in done.stdout and "chain anchored in its memo" in done.stdout
    assert "chain_broken" in done.stdout and "not its head" in done.stdout


async def test_a_cancelled_turn_anchors_its_head_in_the_memo(
    stack: StackFactory, db_url: str
) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        turn_id = await running_turn(tt)
        await tt.get_turn(turn_id).workflow_handle.cancel()
        await until_status(tt, turn_id, WorkflowExecutionStatus.CANCELED)
        report = await tt.verify(turn_id)
        assert report.temporal_status == report.trail_status == "cancelled"
        assert [e.kind for e in await tt.audit(turn_id)][-2:] == ["turn_cancelled", "turn_end"]
        await assert_anchored_and_cut_caught(tt, turn_id, "memo")


async def test_agent_run_turns_are_anchored_completed_and_failed(
    stack: StackFactory, db_url: str
) -> None:
    # One identical call per model turn: the third turn's call is stopped as a loop, so the
    # run has two completed turns (anchored in their results) and a failed one (its memo).
    script: list[Any] = [tool_call_response((f"m{i}", "echo", {"text": "x"})) for i in range(4)]
    config = RunConfig(detection=LoopDetection(loop_threshold=1, stop_threshold=2))
    run_id = f"agent-anchor-{uuid.uuid4()}"
    async with stack(Host([echo], model=ScriptedModel(script)), database_url=db_url) as tt:
        with pytest.raises(LoopDetected):
            await tt.run_agent("loop", session_id=run_id, run_id=run_id, config=config)
        turns = sorted(await tt.turns(session_id=run_id), key=lambda t: t.started_at)
        assert [t.status for t in turns] == ["completed", "completed", "failed"]
        first, _, last = (t.turn_id for t in turns)
        await assert_anchored_and_cut_caught(tt, first, "result")
        await assert_anchored_and_cut_caught(tt, last, "memo")


async def test_anchors_with_the_payload_codec_on(
    temporal_env: WorkflowEnvironment, db_url: str, tmp_path: Path
) -> None:
    converter = settings_data_converter(Settings(codec_keys=KEYS))
    async with running(temporal_env, converter, db_url, tmp_path, host=HOST) as tt:
        failed = await failed_turn(tt)
        cancelled = await running_turn(tt)
        await tt.get_turn(cancelled).workflow_handle.cancel()
        await until_status(tt, cancelled, WorkflowExecutionStatus.CANCELED)

        # The memo is encrypted like every payload: without the keys it is not readable.
        history = await tt.client.get_workflow_handle(failed).fetch_history()
        raw = json.dumps(json.loads(history.to_json()))
        head = (await tt.audit(failed))[-1].digest
        assert head is not None and head not in raw
        keyless = await Client.connect(
            temporal_env.client.service_client.config.target_host,
            namespace=temporal_env.client.namespace,
        )
        report = await verify_turn(keyless, tt.store, cancelled)
        assert [p.kind for p in report.problems] == ["undecodable"]

        for turn_id in (failed, cancelled):
            await assert_anchored_and_cut_caught(tt, turn_id, "memo")


def _history(name: str) -> WorkflowHistory:
    data = json.loads((HISTORIES / f"{name}.json").read_text())
    return WorkflowHistory.from_json(data.pop("workflowId"), data)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("recovery_exhausted", "recovery_exhausted_anchored"),
        ("cancelled_during_tool", "cancelled_during_tool_anchored"),
    ],
)
async def test_runs_recorded_before_the_memo_anchor_are_not_anchored(
    temporal_env: WorkflowEnvironment, before: str, after: str
) -> None:
    # Real histories recorded by workers without and with the anchor (tests/histories).
    client = temporal_env.client
    assert await _trail_head(client, list(_history(before).events)) is None
    head, where = await _trail_head(client, list(_history(after).events)) or ("", "")
    assert where == "memo" and len(head) == 64


async def test_a_terminated_turn_is_not_anchored_and_says_so(
    stack: StackFactory, sqlite_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with stack(HOST, database_url=sqlite_url) as tt:
        turn_id = await running_turn(tt)
        await tt.get_turn(turn_id).workflow_handle.terminate("anchor test")
        await until_status(tt, turn_id, WorkflowExecutionStatus.TERMINATED)
        await tt.reconcile()
        report = await tt.verify(turn_id)
        # Not a mismatch: nothing of the turn ran after Temporal ended it.
        assert report.ok and report.anchor is None, report.problems
    address = temporal_env.client.service_client.config.target_host
    args = ["audit", "verify", turn_id, "--temporal-address", address]
    done = await asyncio.to_thread(run_cli, [*args, "--database-url", sqlite_url], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "chain not anchored" in done.stdout
