"""Run-aware audit records on real SQLite and PostgreSQL: each Temporal run keeps its branch."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import text
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client

from tests.conftest import StackFactory
from tests.db.test_database import flush
from tests.support.cli_runner import run_cli
from tooltrail import Host, ToolCall, tool
from tooltrail.core.branches import branch_point
from tooltrail.core.wire import AuditEvent, Flush, TurnOutput
from tooltrail.db.store import AuditStore


def run_flush(turn_id: str, run_id: str, seqs: range, *, status: str = "running") -> Flush:
    records = flush(turn_id, seqs, status=status)
    for event in records.events:
        event.payload["output"] = f"{run_id}:{event.seq}"
    return records.model_copy(update={"run_id": run_id})


async def test_a_new_run_writes_its_own_branch_and_the_turn_follows_it(db_url: str) -> None:
    store = AuditStore(db_url)
    turn_id = f"runs-{datetime.now(UTC).timestamp()}"
    try:
        await store.write_flush(run_flush(turn_id, "run-a", range(0, 2)))
        await store.write_flush(run_flush(turn_id, "run-a", range(2, 3), status="completed"))
        # A reset: the new run numbers its records from 0 again, and ends differently.
        await store.write_flush(run_flush(turn_id, "run-b", range(0, 2)))
        await store.write_flush(run_flush(turn_id, "run-b", range(2, 4), status="failed"))
        # A late, re-sent write of the earlier run changes nothing of the latest.
        await store.write_flush(run_flush(turn_id, "run-a", range(0, 3), status="completed"))
        latest = await store.events(turn_id)
        every = await store.events(turn_id, all_runs=True)
        runs = await store.runs(turn_id)
        row = await store.turn(turn_id)
        summary = [t for t in await store.turns(limit=500) if t.turn_id == turn_id]
    finally:
        await store.close()
    assert [(e.run_id, e.seq, e.payload["output"]) for e in latest] == [
        ("run-b", s, f"run-b:{s}") for s in range(4)
    ]
    assert [(e.run_id, e.seq) for e in every] == [("run-a", s) for s in range(3)] + [
        ("run-b", s) for s in range(4)
    ]
    assert [(r.run_id, r.branched_from, r.latest) for r in runs] == [
        ("run-a", None, False),
        ("run-b", "run-a", True),
    ]
    assert row is not None and (row.run_id, row.status) == ("run-b", "failed")
    assert summary[0].event_count == 4  # the latest run's records only


async def test_records_without_a_run_id_stay_one_branch(db_url: str) -> None:
    # Records of workers older than run ids (and direct writes) keep the old behaviour.
    store = AuditStore(db_url)
    turn_id = f"norun-{datetime.now(UTC).timestamp()}"
    try:
        await store.write_flush(flush(turn_id, range(0, 2)))
        await store.write_flush(flush(turn_id, range(0, 3), status="completed"))
        events = await store.events(turn_id)
        runs = await store.runs(turn_id)
    finally:
        await store.close()
    assert [(e.run_id, e.seq) for e in events] == [("", 0), ("", 1), ("", 2)]
    assert [(r.run_id, r.branched_from, r.latest) for r in runs] == [("", None, True)]


def _event(seq: int, output: str, at: int) -> AuditEvent:
    return AuditEvent(
        seq=seq,
        kind="tool_post",
        payload={"output": output},
        created_at=datetime(2026, 1, 1, 0, 0, at, tzinfo=UTC),
    )


def test_the_branch_point_is_the_first_record_that_differs() -> None:
    earlier = [_event(0, "a", 0), _event(1, "b", 1), _event(2, "c", 2)]
    # Workflow time differs in a re-executed task; content decides.
    later = [_event(0, "a", 5), _event(1, "B", 6)]
    assert branch_point(earlier, later) == 1
    assert branch_point(earlier, earlier[:2]) == 2
    assert branch_point([], later) == 0


# -- a real reset on the Temporal server -----------------------------------------------------

_version = {"value": "v1"}


@tool
async def versioned(text: str) -> str:
    """Return the text tagged with the tool's current version."""
    return f"{_version['value']}:{text}"


async def _reset_to_first_workflow_task(client: Client, workflow_id: str) -> str:
    """What ``temporal workflow reset --type FirstWorkflowTask`` does; return the new run id."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    first_task = next(
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    response = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id),
            reason="the tool changed",
            workflow_task_finish_event_id=first_task,
            request_id=str(uuid.uuid4()),
        )
    )
    return response.run_id


async def test_a_reset_turn_shows_its_new_run_and_keeps_the_old_one(
    stack: StackFactory, db_url: str
) -> tuple[str, str, str]:
    _version["value"] = "v1"
    async with stack(Host([versioned]), database_url=db_url) as tt:
        turn = await tt.run_turn([ToolCall("c1", "versioned", {"text": "x"})], session_id="s")
        first_run = (await tt.client.get_workflow_handle(turn.turn_id).describe()).run_id
        before = await tt.audit(turn.turn_id)
        # The operator changes the tool, then resets the finished turn.
        _version["value"] = "v2"
        new_run = await _reset_to_first_workflow_task(tt.client, turn.turn_id)
        again = await tt.client.get_workflow_handle(
            turn.turn_id, run_id=new_run, result_type=TurnOutput
        ).result()
        after = await tt.audit(turn.turn_id)
        every = await tt.audit(turn.turn_id, all_runs=True)
        runs = await tt.runs(turn.turn_id)
        row = await tt.store.turn(turn.turn_id)
        heads = {first_run: turn.trail_head, new_run: again.trail_head}
        chains = await tt.store.chain_problems(turn.turn_id, heads=heads)
        # Cut the new run's last record: its chain still holds, its anchor in Temporal's
        # history (the workflow result) does not.
        async with tt.store.sessions.begin() as session:
            await session.execute(
                text(
                    "DELETE FROM audit_event WHERE turn_id = :t AND run_id = :r AND seq = "
                    "(SELECT MAX(seq) FROM audit_event WHERE turn_id = :t AND run_id = :r)"
                ),
                {"t": turn.turn_id, "r": new_run},
            )
        cut = await tt.store.chain_problems(turn.turn_id, heads=heads)
        unanchored = await tt.store.chain_problems(turn.turn_id)
    assert turn.results[0].output == "v1:x"
    assert again.results[0].output == "v2:x"

    def outputs(events: list[AuditEvent]) -> list[tuple[str | None, object]]:
        return [(e.run_id, e.payload["output"]) for e in events if e.kind == "tool_post"]

    assert outputs(before) == [(first_run, "v1:x")]
    assert outputs(after) == [(new_run, "v2:x")]
    assert outputs(every) == [(first_run, "v1:x"), (new_run, "v2:x")]
    # Each run has its whole trail, numbered from 0.
    assert [e.seq for e in after] == list(range(len(after)))
    assert [e.seq for e in every if e.run_id == first_run] == [e.seq for e in before]
    assert [(r.run_id, r.branched_from, r.latest) for r in runs] == [
        (first_run, None, False),
        (new_run, first_run, True),
    ]
    assert row is not None and (row.run_id, row.status) == (new_run, "completed")
    # Both runs' hash chains hold over real records, as the database returns them, and end
    # at the heads their workflow results carry.
    assert len(turn.trail_head) == len(again.trail_head) == 64
    assert turn.trail_head != again.trail_head
    assert chains == {first_run: [], new_run: []}
    assert cut[first_run] == [] and unanchored == {first_run: [], new_run: []}
    assert cut[new_run] == [
        "the chain's last record is not its head: records were cut off or added at its end"
    ]
    return turn.turn_id, first_run, new_run


async def test_audit_show_says_where_a_reset_run_branched(
    stack: StackFactory, sqlite_url: str, tmp_path: Path
) -> None:
    turn_id, first_run, new_run = await test_a_reset_turn_shows_its_new_run_and_keeps_the_old_one(
        stack, sqlite_url
    )
    latest = run_cli(["audit", "show", turn_id, "--database-url", sqlite_url], tmp_path)
    every = run_cli(
        ["audit", "show", turn_id, "--all-runs", "--database-url", sqlite_url], tmp_path
    )
    shown = run_cli(
        ["audit", "show", turn_id, "--all-runs", "--json", "--database-url", sqlite_url], tmp_path
    )
    assert latest.returncode == every.returncode == shown.returncode == 0, latest.stderr
    # A reset to the first workflow task re-executes everything: the session state the
    # first run saved already differs in ``turn_started`` (seq 0).
    assert f"run {new_run} (latest)  branched from run {first_run} at seq" in latest.stdout
    assert "v2:x" in latest.stdout and "v1:x" not in latest.stdout
    assert f"run {first_run} (earlier run)" in every.stdout
    assert "v1:x" in every.stdout and "v2:x" in every.stdout
    data = json.loads(shown.stdout)
    runs = [(r["run_id"], r["branched_from"], r["latest"]) for r in data["runs"]]
    assert runs == [(first_run, None, False), (new_run, first_run, True)]
    branch = data["runs"][1]["branch_seq"]
    tool_post = next(e["seq"] for e in data["events"] if e["kind"] == "tool_post")
    assert 0 <= branch <= tool_post


# -- the hash chain of a run -----------------------------------------------------------------


async def _chained_turn(store: AuditStore, turn_id: str) -> list[AuditEvent]:
    # Three batches, as a turn writes them: the chain runs across them.
    await store.write_flush(run_flush(turn_id, "run-a", range(0, 2)))
    await store.write_flush(run_flush(turn_id, "run-a", range(2, 4)))
    await store.write_flush(run_flush(turn_id, "run-a", range(4, 5), status="completed"))
    return await store.events(turn_id)


async def _tamper(store: AuditStore, statements: str, turn_id: str) -> None:
    async with store.sessions.begin() as session:
        for statement in statements.split(";"):
            await session.execute(text(statement), {"turn_id": turn_id})


async def test_the_chain_holds_and_breaks_where_the_trail_was_changed(db_url: str) -> None:
    store = AuditStore(db_url)
    stamp = datetime.now(UTC).timestamp()
    cases = {
        "edited": "UPDATE audit_event SET tool_name = 'x' WHERE turn_id = :turn_id AND seq = 2",
        "deleted": "DELETE FROM audit_event WHERE turn_id = :turn_id AND seq = 1",
        # Swapped in three steps (SQLite checks uniqueness row by row).
        "reordered": "UPDATE audit_event SET seq = 100 WHERE turn_id = :turn_id AND seq = 1;"
        "UPDATE audit_event SET seq = 1 WHERE turn_id = :turn_id AND seq = 3;"
        "UPDATE audit_event SET seq = 3 WHERE turn_id = :turn_id AND seq = 100",
        "truncated": "DELETE FROM audit_event WHERE turn_id = :turn_id AND seq = 4",
    }
    found: dict[str, dict[str, list[str]]] = {}
    try:
        clean = await _chained_turn(store, f"chain-clean-{stamp}")
        head = clean[-1].digest
        assert head is not None
        found["clean"] = await store.chain_problems(f"chain-clean-{stamp}", heads={"run-a": head})
        for case, statement in cases.items():
            turn_id = f"chain-{case}-{stamp}"
            events = await _chained_turn(store, turn_id)
            await _tamper(store, statement, turn_id)
            found[case] = await store.chain_problems(turn_id)
            if case == "truncated":
                found["truncated, head known"] = await store.chain_problems(
                    turn_id, heads={"run-a": events[-1].digest or ""}
                )
    finally:
        await store.close()
    assert all(e.digest and len(e.digest) == 64 for e in clean)
    assert found["clean"] == {"run-a": []}
    assert found["edited"]["run-a"] == [
        "seq 2 (tool_post) does not match its digest: it was changed, or a record before it was"
    ]
    assert found["deleted"]["run-a"] == ["seq 1 is missing (the next record is seq 2)"]
    assert found["reordered"]["run-a"][0].startswith("seq 1 (tool_post) does not match")
    # Without the head kept elsewhere, a chain cut at its end still holds; with it, not.
    assert found["truncated"] == {"run-a": []}
    assert found["truncated, head known"]["run-a"] == [
        "the chain's last record is not its head: records were cut off or added at its end"
    ]
