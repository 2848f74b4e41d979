"""``audit verify`` against someone with write access to the database (SQL edits only).

Each attack rewrites records and recomputes their hash chain (SHA-256 is unkeyed, so anyone
can), the way an attacker with the database would. Before issue 29 each of them passed
verify; now each is reported. Real Temporal dev server, SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import delete, select, update

from tests.conftest import StackFactory
from tooltrail import Host, RunConfig, ToolCall, Tooltrail, tool
from tooltrail.core.chain import GENESIS, chain_digests
from tooltrail.core.hooks import Ask, PreToolUseContext
from tooltrail.core.text import stable_hash
from tooltrail.core.wire import AuditEvent
from tooltrail.db.orm import AuditEventRow, TurnRow
from tooltrail.ops.verify import verify_turn, verify_turns
from tooltrail.pipeline.middleware import RedactingMiddleware


@tool
def echo(text: str) -> str:
    """Echo."""
    return text


@tool(local=True)
def local_echo(text: str) -> str:
    """Echo, as a local activity."""
    return text


class AskForSecond:
    async def pre_tool(self, ctx: PreToolUseContext) -> Ask | None:
        return Ask("go on?") if ctx.tool_call_id == "second" else None


HOST = Host([echo, local_echo])


def _event(row: AuditEventRow) -> AuditEvent:
    return AuditEvent(
        seq=row.seq,
        kind=row.kind,
        tool_call_id=row.tool_call_id,
        tool_name=row.tool_name,
        attempt=row.attempt,
        payload=row.payload,
        created_at=row.created_at,
        temporal_attempt=row.temporal_attempt,
        worker=row.worker,
    )


async def rewrite(
    tt: Tooltrail,
    turn_id: str,
    edit: Callable[[AuditEventRow], None],
    *,
    to_run: str | None = None,
) -> None:
    """Edit a turn's records (optionally moving them to another run id), chain recomputed."""
    async with tt.store.sessions.begin() as session:
        rows = list(
            await session.scalars(
                select(AuditEventRow)
                .where(AuditEventRow.turn_id == turn_id)
                .order_by(AuditEventRow.seq)
            )
        )
        assert rows
        run_id = rows[0].run_id
        # The attacker's recomputation agrees with the store's before the edit.
        assert chain_digests(GENESIS, [_event(r) for r in rows], run_id) == [r.digest for r in rows]
        for row in rows:
            edit(row)
            if to_run is not None:
                row.run_id = to_run
        new_run = to_run or run_id
        for row, digest in zip(
            rows, chain_digests(GENESIS, [_event(r) for r in rows], new_run), strict=True
        ):
            row.digest = digest
        if to_run is not None:
            await session.execute(
                update(TurnRow).where(TurnRow.turn_id == turn_id).values(run_id=to_run)
            )


def forge_output(call_id: str, output: str) -> Callable[[AuditEventRow], None]:
    def edit(row: AuditEventRow) -> None:
        if row.kind == "tool_post" and row.tool_call_id == call_id:
            row.payload = {**row.payload, "output": output}

    return edit


def kinds(report: Any) -> set[str]:
    return {problem.kind for problem in report.problems}


async def test_records_moved_to_a_made_up_run_are_reported(
    stack: StackFactory, db_url: str
) -> None:
    """Edited records under a made-up run id, the turn's row pointed at it: verify checks
    the records of the run Temporal names and reports the stranger (before: ok)."""
    async with stack(HOST, database_url=db_url) as tt:
        turn = await tt.run_turn([ToolCall("a", "echo", {"text": "pay bob"})], session_id="s")
        assert (await tt.verify(turn.turn_id)).ok
        await rewrite(tt, turn.turn_id, forge_output("a", "pay mallory"), to_run="made-up-run")
        report = await tt.verify(turn.turn_id)
    assert report.checkable and not report.ok
    assert {"run_mismatch", "unknown_run", "anchor_mismatch"} <= kinds(report), report.problems
    unknown = next(p for p in report.problems if p.kind == "unknown_run")
    assert "'made-up-run', which Temporal does not know" in unknown.detail


async def test_a_turn_of_local_attempts_with_every_record_deleted_is_reported(
    stack: StackFactory, db_url: str
) -> None:
    """No tool activity in the history to miss a record: the anchor Temporal kept is what
    tells that the trail is gone (before: ok)."""
    async with stack(HOST, database_url=db_url) as tt:
        turn = await tt.run_turn(
            [ToolCall("a", "local_echo", {"text": "x"})], session_id=f"s-{uuid.uuid4()}"
        )
        assert (await tt.verify(turn.turn_id)).ok
        async with tt.store.sessions.begin() as session:
            await session.execute(
                delete(AuditEventRow).where(AuditEventRow.turn_id == turn.turn_id)
            )
        report = await tt.verify(turn.turn_id)
    assert not report.ok and "anchor_mismatch" in kinds(report), report.problems
    assert any("no record of the run" in p.detail for p in report.problems)


async def test_an_edit_in_the_middle_of_a_terminated_turn_is_reported(
    stack: StackFactory, db_url: str
) -> None:
    """A terminated turn has no final anchor, but each write's head is in its history."""
    host = Host([echo], hooks=[AskForSecond()])
    async with stack(host, database_url=db_url) as tt:
        handle = await tt.start_turn(
            [ToolCall("first", "echo", {"text": "pay bob"}), ToolCall("second", "echo", {})],
            session_id=f"s-{uuid.uuid4()}",
            config=RunConfig(interactive=True, approval_timeout_s=120),
        )
        for _ in range(600):
            if await handle.pending_approvals():
                break
            await asyncio.sleep(0.05)
        await tt.client.get_workflow_handle(handle.turn_id).terminate("operator")
        await tt.reconcile()
        clean = await tt.verify(handle.turn_id)
        assert clean.ok and clean.temporal_status == "terminated", clean.problems
        await rewrite(tt, handle.turn_id, forge_output("first", "pay mallory"))
        report = await tt.verify(handle.turn_id)
    assert not report.ok
    assert "anchor_mismatch" in kinds(report), report.problems
    assert "output_mismatch" in kinds(report)


async def test_an_input_rewritten_with_its_chain_is_reported(
    stack: StackFactory, db_url: str
) -> None:
    """verify compares what the trail says a call was given with what Temporal ran."""

    def forge_input(row: AuditEventRow) -> None:
        if row.kind == "tool_post":
            row.payload = {**row.payload, "input": {"text": "something else"}}

    async with stack(HOST, database_url=db_url) as tt:
        turn = await tt.run_turn([ToolCall("a", "echo", {"text": "x"})], session_id="s")
        await rewrite(tt, turn.turn_id, forge_input)
        report = await tt.verify(turn.turn_id)
    problem = next(p for p in report.problems if p.kind == "input_mismatch")
    assert problem.tool_call_id == "a" and "arguments of digest" in problem.detail


async def test_a_turn_deleted_from_the_database_is_not_skipped_by_session(
    stack: StackFactory, db_url: str
) -> None:
    """``verify --session`` lists the session's turns from Temporal too (before: a turn
    deleted from SQL was silently left out, and the session verified ok)."""
    session_id = f"s-{uuid.uuid4()}"
    async with stack(HOST, database_url=db_url) as tt:
        kept = await tt.run_turn([ToolCall("a", "echo", {"text": "1"})], session_id=session_id)
        gone = await tt.run_turn([ToolCall("a", "echo", {"text": "2"})], session_id=session_id)
        await tt.run_turn([ToolCall("a", "echo", {"text": "3"})], session_id="another")
        async with tt.store.sessions.begin() as session:
            await session.execute(
                delete(AuditEventRow).where(AuditEventRow.turn_id == gone.turn_id)
            )
            await session.execute(delete(TurnRow).where(TurnRow.turn_id == gone.turn_id))
        for _ in range(100):  # visibility lists a new workflow within moments
            reports = await verify_turns(tt.client, tt.store, session_id=session_id)
            if len(reports) == 2:
                break
            await asyncio.sleep(0.1)
    by_turn = {report.turn_id: report for report in reports}
    assert set(by_turn) == {kept.turn_id, gone.turn_id}
    assert by_turn[kept.turn_id].ok
    assert "missing_turn_row" in kinds(by_turn[gone.turn_id])


async def test_redacted_inputs_compare_with_the_hosts_rules(
    stack: StackFactory, db_url: str
) -> None:
    """The trail stores inputs redacted: the history's are redacted with the host's rules
    before the comparison (``tt.verify``, ``audit verify --tools``); without the rules the
    difference is reported rather than hidden."""
    host = Host([echo], middleware=[RedactingMiddleware({"email": r"[\w.+-]+@[\w-]+\.[\w.]+"})])
    async with stack(host, database_url=db_url) as tt:
        turn = await tt.run_turn(
            [ToolCall("a", "echo", {"text": "mail bob@example.com"})], session_id="s"
        )
        trail = await tt.audit(turn.turn_id)
        post = next(e for e in trail if e.kind == "tool_post")
        assert "bob@example.com" not in str(post.payload["input"])
        assert (await tt.verify(turn.turn_id)).ok
        bare = await verify_turn(tt.client, tt.store, turn.turn_id)
    assert kinds(bare) == {"input_mismatch"}


async def test_a_local_attempts_output_is_checked_from_its_marker(
    stack: StackFactory, db_url: str
) -> None:
    """A local attempt has no activity events, but its marker holds its result: an output
    rewritten in SQL (chain recomputed) no longer matches it."""
    async with stack(HOST, database_url=db_url) as tt:
        turn = await tt.run_turn([ToolCall("a", "local_echo", {"text": "pay bob"})], session_id="s")
        clean = await tt.verify(turn.turn_id)
        assert clean.ok and clean.local_attempts_checked == 1, clean.problems
        assert "local tool attempt" in clean.not_checked[0]

        def forge(row: AuditEventRow) -> None:
            if row.kind == "tool_post":
                output = "pay mallory"
                row.payload = {**row.payload, "output": output, "result_hash": stable_hash(output)}

        await rewrite(tt, turn.turn_id, forge)
        report = await tt.verify(turn.turn_id)
        local = [p for p in report.problems if p.kind == "output_mismatch"]
        assert local and "local tool attempt" in local[0].detail, report.problems

        def forge_output_only(row: AuditEventRow) -> None:
            if row.kind == "tool_post":
                row.payload = {
                    **row.payload,
                    "output": "pay eve",
                    "result_hash": stable_hash("pay bob"),
                }

        await rewrite(tt, turn.turn_id, forge_output_only)
        report = await tt.verify(turn.turn_id)
    assert any(p.kind == "output_mismatch" for p in report.problems), report.problems
