"""``verify``: the audit trail checked against Temporal's history (real Temporal, SQL, codec)."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, func, select, update
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tests.ops.test_encrypted_ops import KEYS, running
from tests.runtime.test_reconcile import HOST, echo, running_turn, temporal_cli, until_status
from tests.support.cli_runner import error_lines, run_cli
from tooltrail import Host, RunConfig, ToolCall, Tooltrail
from tooltrail.db.orm import AuditEventRow, Base, BlobRow, TurnRow
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response
from tooltrail.ops.verify import verify_turn, verify_turns
from tooltrail.runtime.worker import settings_data_converter
from tooltrail.settings import Settings

LONG = "x" * 400
"""Above ``large_output_bytes=100``: kept in ``blob`` (each turn's own, by a prefix)."""


async def clean_turn(tt: Tooltrail, session_id: str | None = None) -> str:
    """A completed turn: two calls, one of them with an output kept in ``blob``."""
    turn = await tt.run_turn(
        [
            ToolCall(id="a", name="echo", arguments={"text": "hello"}),
            ToolCall(id="b", name="echo", arguments={"text": f"{uuid.uuid4()}{LONG}"}),
        ],
        session_id=session_id or f"s-{uuid.uuid4()}",
        config=RunConfig(large_output_bytes=100),
    )
    return turn.turn_id


async def snapshot(tt: Tooltrail) -> dict[str, list[str]]:
    """Every row of every table of the schema, to show verify writes nothing."""
    rows: dict[str, list[str]] = {}
    async with tt.store.sessions() as session:
        for table in Base.metadata.sorted_tables:
            rows[table.name] = sorted(map(repr, (await session.execute(select(table))).all()))
    return rows


async def edit_output(tt: Tooltrail, turn_id: str, call_id: str, output: str) -> None:
    async with tt.store.sessions.begin() as session:
        row = await session.scalar(
            select(AuditEventRow).where(
                AuditEventRow.turn_id == turn_id,
                AuditEventRow.tool_call_id == call_id,
                AuditEventRow.kind == "tool_post",
            )
        )
        assert row is not None
        row.payload = {**row.payload, "output": output}


async def test_a_clean_trail_passes_and_edits_deletions_and_statuses_fail(
    stack: StackFactory, db_url: str
) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        turn_id = await clean_turn(tt)
        report = await tt.verify(turn_id)
        assert report.ok and report.checkable, report.problems
        assert report.attempts_checked == 2
        assert report.trail_status == report.temporal_status == "completed"
        assert report.run_id == (await tt.client.get_workflow_handle(turn_id).describe()).run_id

        # An edited output: its digest no longer is the one Temporal returned.
        before = await snapshot(tt)
        await edit_output(tt, turn_id, "a", "hullo")
        report = await tt.verify(turn_id)
        assert not report.ok and report.checkable
        problem, chain = sorted(report.problems, key=lambda p: p.kind, reverse=True)
        assert (problem.kind, problem.tool_call_id, problem.attempt) == ("output_mismatch", "a", 0)
        # The record no longer has its hash chain digest either.
        assert chain.kind == "chain_broken" and "does not match its digest" in chain.detail
        await edit_output(tt, turn_id, "a", "hello")
        assert (await tt.verify(turn_id)).ok

        # A wrong final status.
        async with tt.store.sessions.begin() as session:
            await session.execute(
                update(TurnRow).where(TurnRow.turn_id == turn_id).values(status="failed")
            )
        report = await tt.verify(turn_id)
        assert [p.kind for p in report.problems] == ["status_mismatch"]
        assert "'failed'" in report.problems[0].detail
        assert "'completed'" in report.problems[0].detail

        # A deleted record: the tool activity has no tool_post any more, and seq has a hole.
        async with tt.store.sessions.begin() as session:
            await session.execute(
                delete(AuditEventRow).where(
                    AuditEventRow.turn_id == turn_id,
                    AuditEventRow.tool_call_id == "b",
                    AuditEventRow.kind == "tool_post",
                )
            )
        report = await tt.verify(turn_id)
        kinds = sorted(p.kind for p in report.problems)
        assert kinds == ["chain_broken", "missing_record", "seq_gap", "status_mismatch"]
        missing = next(p for p in report.problems if p.kind == "missing_record")
        assert (missing.tool_call_id, missing.attempt) == ("b", 0)
        # verify wrote nothing along the way (the edits above are the test's own).
        after = await snapshot(tt)
        rows = {table: len(rows) for table, rows in before.items()}
        rows["audit_event"] -= 1
        assert {table: len(rows) for table, rows in after.items()} == rows


async def test_a_truncated_or_rewritten_trail_breaks_its_anchored_chain(
    stack: StackFactory, db_url: str
) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        turn_id = await clean_turn(tt)
        assert (await tt.verify(turn_id)).ok
        # A record no output check covers: only its hash chain digest tells of the edit.
        async with tt.store.sessions.begin() as session:
            await session.execute(
                update(AuditEventRow)
                .where(AuditEventRow.turn_id == turn_id, AuditEventRow.seq == 0)
                .values(payload={"rewritten": True})
            )
        report = await tt.verify(turn_id)
        assert [p.kind for p in report.problems] == ["chain_broken"]
        assert "seq 0" in report.problems[0].detail

    async with stack(HOST, database_url=db_url) as tt:
        turn_id = await clean_turn(tt)
        # The trail cut after its last tool record: consistent on its own, short of the head
        # the turn anchored in Temporal's history.
        async with tt.store.sessions.begin() as session:
            last = await session.scalar(
                select(func.max(AuditEventRow.seq)).where(AuditEventRow.turn_id == turn_id)
            )
            await session.execute(
                delete(AuditEventRow).where(
                    AuditEventRow.turn_id == turn_id, AuditEventRow.seq == last
                )
            )
        report = await tt.verify(turn_id)
        assert [p.kind for p in report.problems] == ["chain_broken"]
        assert "not its head" in report.problems[0].detail


async def test_a_large_outputs_blob_is_checked_too(stack: StackFactory, db_url: str) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        turn_id = await clean_turn(tt)
        events = await tt.audit(turn_id)
        [post] = [e for e in events if e.kind == "tool_post" and e.tool_call_id == "b"]
        key = post.payload["output_ref"]
        async with tt.store.sessions.begin() as session:
            blob = await session.get(BlobRow, key)
            assert blob is not None
            blob.content = {"output": blob.content["output"] + "y"}
        report = await tt.verify(turn_id)
        assert [(p.kind, p.tool_call_id) for p in report.problems] == [("output_mismatch", "b")]


async def test_verify_writes_nothing(stack: StackFactory, db_url: str) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        turn_id = await clean_turn(tt)
        await edit_output(tt, turn_id, "a", "tampered")
        before = await snapshot(tt)
        assert before["turn"] and before["audit_event"] and before["turn_run"]
        assert not (await tt.verify(turn_id)).ok
        assert not (await tt.verify(f"turn-{uuid.uuid4()}")).checkable
        assert await snapshot(tt) == before


async def test_unknown_turn_and_history_gone_cannot_be_checked(
    stack: StackFactory, db_url: str
) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        report = await tt.verify(f"turn-{uuid.uuid4()}")
        assert not report.ok and not report.checkable
        assert [p.kind for p in report.problems] == ["unknown_turn"]
        assert "neither the audit database nor Temporal" in report.problems[0].detail

        gone = f"turn-gone-{uuid.uuid4()}"
        async with tt.store.sessions.begin() as session:
            session.add(
                TurnRow(
                    turn_id=gone,
                    session_id="s",
                    status="completed",
                    started_at=datetime.now(UTC) - timedelta(days=40),
                )
            )
        report = await tt.verify(gone)
        assert not report.checkable
        assert [p.kind for p in report.problems] == ["history_gone"]
        assert "retention" in report.problems[0].detail
        async with tt.store.sessions.begin() as session:
            await session.execute(delete(TurnRow).where(TurnRow.turn_id == gone))


async def test_a_terminated_turn_disagrees_until_reconciled(
    stack: StackFactory, db_url: str
) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        turn_id = await running_turn(tt)
        await tt.get_turn(turn_id).workflow_handle.terminate("verify test")
        await until_status(tt, turn_id, WorkflowExecutionStatus.TERMINATED)
        report = await tt.verify(turn_id)
        assert [p.kind for p in report.problems] == ["status_mismatch"]
        assert "audit reconcile" in report.problems[0].detail
        await tt.reconcile()
        report = await tt.verify(turn_id)
        assert report.ok, report.problems
        assert report.temporal_status == report.trail_status == "terminated"


async def test_cli_audit_verify_exit_codes(
    stack: StackFactory, db_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    address = temporal_env.client.service_client.config.target_host
    common = ["--temporal-address", address, "--database-url", db_url]
    session_id = f"s-{uuid.uuid4()}"

    def cli(*args: str) -> Any:
        return asyncio.to_thread(run_cli, ["audit", "verify", *args, *common], tmp_path)

    async with stack(HOST, database_url=db_url) as tt:
        since = datetime.now(UTC).isoformat()
        first = await clean_turn(tt, session_id)
        second = await clean_turn(tt, session_id)
        done = await cli("--since", since, "--json")
        assert done.returncode == 0, done.stderr
        assert sorted(r["turn_id"] for r in json.loads(done.stdout)) == sorted([first, second])
        done = await cli(first)
        assert done.returncode == 0, done.stderr
        assert "ok" in done.stdout and first in done.stdout

        done = await cli("--session", session_id, "--json")
        assert done.returncode == 0, done.stderr
        reports = json.loads(done.stdout)
        assert sorted(r["turn_id"] for r in reports) == sorted([first, second])
        assert all(r["ok"] for r in reports)

        await edit_output(tt, second, "a", "edited")
        done = await cli("--session", session_id)
        assert done.returncode == 1
        assert "MISMATCH" in done.stdout and "output_mismatch" in done.stdout

        done = await cli(f"turn-{uuid.uuid4()}", "--json")
        assert done.returncode == 2
        [report] = json.loads(done.stdout)
        assert report["ok"] is False and report["checkable"] is False
        assert report["problems"][0]["kind"] == "unknown_turn"

        done = await cli("--session", f"nobody-{uuid.uuid4()}")
        assert done.returncode == 2
        assert "no turns match" in done.stderr


async def test_verify_with_the_payload_codec_on(
    temporal_env: WorkflowEnvironment, db_url: str, tmp_path: Path
) -> None:
    converter = settings_data_converter(Settings(codec_keys=KEYS))
    async with running(temporal_env, converter, db_url, tmp_path) as tt:
        turn_id = await clean_turn(tt)
        report = await tt.verify(turn_id)
        assert report.ok and report.attempts_checked == 2, report.problems

        # Without the keys the history cannot be read: not checked, rather than passed.
        keyless = await Client.connect(
            temporal_env.client.service_client.config.target_host,
            namespace=temporal_env.client.namespace,
        )
        report = await verify_turn(keyless, tt.store, turn_id)
        assert not report.checkable
        assert [p.kind for p in report.problems] == ["undecodable"]

        await edit_output(tt, turn_id, "a", "edited")
        report = await tt.verify(turn_id)
        assert sorted(p.kind for p in report.problems) == ["chain_broken", "output_mismatch"]

        # The command line with the deployment's keys (TOOLTRAIL_CODEC_KEYS).
        address = temporal_env.client.service_client.config.target_host
        args = ["audit", "verify", turn_id, "--temporal-address", address, "--database-url", db_url]
        done = await asyncio.to_thread(run_cli, args, tmp_path, TOOLTRAIL_CODEC_KEYS=KEYS)
        assert done.returncode == 1, done.stderr
        await edit_output(tt, turn_id, "a", "hello")
        done = await asyncio.to_thread(run_cli, args, tmp_path, TOOLTRAIL_CODEC_KEYS=KEYS)
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("bad", ["", "turn\x00nul", "t" * 1000])
async def test_ids_no_turn_can_have_are_unknown_on_every_database(
    stack: StackFactory, db_url: str, bad: str
) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        report = await tt.verify(bad)
        assert not report.checkable
        assert [p.kind for p in report.problems] == ["unknown_turn"]
        assert "no turn can have this id" in report.problems[0].detail
        assert await verify_turns(tt.client, tt.store, session_id=bad) == []


async def test_agent_run_turns_verify_and_a_run_id_is_not_a_turn(
    stack: StackFactory, db_url: str
) -> None:
    model = ScriptedModel(
        [tool_call_response(("m1", "echo", {"text": "hi"})), text_response("done")]
    )
    async with stack(Host([echo], model=model), database_url=db_url) as tt:
        result = await tt.run_agent("go", session_id=f"agent-{uuid.uuid4()}")
        assert len(result.turns) == 2
        reports = [await tt.verify(turn_id) for turn_id in result.turns]
        assert all(r.ok for r in reports), [r.problems for r in reports]
        assert reports[0].attempts_checked == 1
        report = await tt.verify(result.run_id)
        assert not report.checkable
        assert "AgentRunWorkflow" in report.problems[0].detail


async def test_a_turn_cancelled_with_the_temporal_cli_records_itself_and_verifies(
    stack: StackFactory, db_url: str, temporal_env: WorkflowEnvironment
) -> None:
    async with stack(HOST, database_url=db_url) as tt:
        turn_id = await running_turn(tt)
        temporal_cli(temporal_env, "workflow", "cancel", "--workflow-id", turn_id)
        await until_status(tt, turn_id, WorkflowExecutionStatus.CANCELED)
        # A worker was there: the turn wrote its own end; nothing is left to reconcile.
        row = await tt.store.turn(turn_id)
        assert row is not None and row.status == "cancelled"
        report = await tt.reconcile()
        assert turn_id not in [c.turn_id for c in report.changed]
        verified = await tt.verify(turn_id)
        assert verified.ok and verified.temporal_status == "cancelled", verified.problems


def test_cli_verify_without_temporal_cannot_check(tmp_path: Path) -> None:
    # An error is "cannot check" (2), never read as a mismatch (1).
    done = run_cli(
        ["audit", "verify", "turn-x", "--temporal-address", "127.0.0.1:1"], tmp_path, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert len(error_lines(done.stderr)) == 1
