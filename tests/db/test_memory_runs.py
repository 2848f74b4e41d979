"""Run-aware memory notes: a reset turn's new run keeps its notes; reads show the latest run's.

Real Temporal (a real reset), real SQLite and PostgreSQL, and the migration that makes the
notes run-aware applied over rows written before it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, text

from tests.conftest import StackFactory, scratch_postgres_database
from tests.db.test_trail_runs import _reset_to_first_workflow_task, _version, versioned
from tooltrail import Host, ToolCall
from tooltrail.core.wire import TurnOutput
from tooltrail.db.migrate import upgrade
from tooltrail.db.orm import MemoryEntryRow
from tooltrail.db.store import AuditStore

_BEFORE = "9d3b7e5a1c24"
"""The revision before memory notes were run-aware."""


async def test_a_reset_turn_keeps_its_new_runs_notes_and_reads_show_them(
    stack: StackFactory, db_url: str
) -> None:
    _version["value"] = "v1"
    session = f"mem-{uuid.uuid4()}"
    async with stack(Host([versioned]), database_url=db_url) as tt:
        turn = await tt.run_turn([ToolCall("c1", "versioned", {"text": "x"})], session_id=session)
        first_run = (await tt.client.get_workflow_handle(turn.turn_id).describe()).run_id
        before = await tt.memory(session)
        # The operator changes the tool, then resets the finished turn.
        _version["value"] = "v2"
        new_run = await _reset_to_first_workflow_task(tt.client, turn.turn_id)
        await tt.client.get_workflow_handle(
            turn.turn_id, run_id=new_run, result_type=TurnOutput
        ).result()
        # Another turn of the session, never reset: its notes are its only run's.
        other = await tt.run_turn([ToolCall("c2", "versioned", {"text": "y"})], session_id=session)
        after = await tt.memory(session)
        async with tt.store.sessions() as db:
            stored = (
                await db.execute(
                    select(MemoryEntryRow.turn_id, MemoryEntryRow.run_id, MemoryEntryRow.content)
                    .where(MemoryEntryRow.session_id == session)
                    .order_by(MemoryEntryRow.id)
                )
            ).all()
    assert [(m.turn_id, m.run_id) for m in before] == [(turn.turn_id, first_run)]
    assert "v1:x" in before[0].content
    # Both runs' notes are stored; a read shows the reset turn's latest run's only.
    assert [(t, r) for t, r, _ in stored[:2]] == [
        (turn.turn_id, first_run),
        (turn.turn_id, new_run),
    ]
    assert "v1:x" in stored[0].content and "v2:x" in stored[1].content
    assert [(m.turn_id, m.run_id != "") for m in after] == [
        (turn.turn_id, True),
        (other.turn_id, True),
    ]
    assert after[0].run_id == new_run and "v2:x" in after[0].content
    assert after[1].run_id != "" and "v2:y" in after[1].content


# -- the migration over notes written before it ----------------------------------------------

T0 = datetime(2026, 1, 2, tzinfo=UTC)


async def _fill_before(url: str) -> None:
    """Rows as the schema before run-aware notes held them.

    ``old``: a turn recorded before run ids (records and turn row with an empty run id).
    ``reset``: a turn whose second run (a reset) wrote records at the same ``seq`` as its
    first; the note at seq 1 was kept from the first run, the second run's dropped.
    """
    store = AuditStore(url)
    try:
        async with store.sessions.begin() as session:
            for turn_id, run_id in (("old", ""), ("reset", "run-b")):
                await session.execute(
                    text(
                        "INSERT INTO turn (turn_id, session_id, status, started_at, call_count,"
                        " mode, run_id) VALUES (:t, 'mig', 'completed', :at, 1, 'live', :r)"
                    ),
                    {"t": turn_id, "r": run_id, "at": T0},
                )
            for run_id, offset in (("run-a", 0), ("run-b", 5)):
                await session.execute(
                    text(
                        "INSERT INTO turn_run (turn_id, run_id, created_at)"
                        " VALUES ('reset', :r, :at)"
                    ),
                    {"r": run_id, "at": T0 + timedelta(seconds=offset)},
                )
            records = [("old", "", 0), ("old", "", 1)] + [
                ("reset", run, seq) for run in ("run-a", "run-b") for seq in (0, 1)
            ]
            for turn_id, run_id, seq in records:
                await session.execute(
                    text(
                        "INSERT INTO audit_event (turn_id, run_id, seq, kind, payload, created_at)"
                        " VALUES (:t, :r, :s, :k, '{}', :at)"
                    ),
                    {
                        "t": turn_id,
                        "r": run_id,
                        "s": seq,
                        "k": "tool_post" if seq else "turn_started",
                        "at": T0,
                    },
                )
            for turn_id in ("old", "reset"):
                await session.execute(
                    text(
                        "INSERT INTO memory_entry (session_id, turn_id, seq, kind, content,"
                        " tool_call_id, created_at) VALUES ('mig', :t, 1, 'trajectory', :c, 'c',"
                        " :at)"
                    ),
                    {"t": turn_id, "c": f"note of {turn_id}", "at": T0},
                )
    finally:
        await store.close()


async def _check_after(url: str) -> None:
    store = AuditStore(url)
    try:
        async with store.sessions() as session:
            rows = (
                await session.execute(
                    select(MemoryEntryRow.turn_id, MemoryEntryRow.run_id).order_by(
                        MemoryEntryRow.turn_id
                    )
                )
            ).all()
        # The reset turn's note is its first run's (the one that wrote it); the old turn's
        # keeps the empty run id of its records.
        assert [tuple(r) for r in rows] == [("old", ""), ("reset", "run-a")]
        # The reset turn's latest run has no note of its own: none is shown for it (the
        # first run's note is not the latest run's); the old turn's note is shown.
        assert [(m.turn_id, m.content) for m in await store.memory("mig")] == [
            ("old", "note of old")
        ]
        # The latest run's note at the same seq is no longer dropped as a duplicate.
        async with store.sessions.begin() as session:
            await session.execute(
                text(
                    "INSERT INTO memory_entry (session_id, turn_id, run_id, seq, kind, content,"
                    " tool_call_id, created_at) VALUES ('mig', 'reset', 'run-b', 1, 'trajectory',"
                    " 'note of run-b', 'c', :at)"
                ),
                {"at": T0 + timedelta(seconds=6)},
            )
        assert [m.content for m in await store.memory("mig")] == ["note of old", "note of run-b"]
    finally:
        await store.close()


async def test_the_migration_keeps_old_notes_and_names_their_run_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'before.db'}"
    await upgrade(url, _BEFORE)
    await _fill_before(url)
    await upgrade(url)
    await _check_after(url)


@pytest.fixture
async def fresh_postgres(postgres_server_url: str) -> AsyncIterator[str]:
    """An empty PostgreSQL database of this test's own (dropped after it); the server is the
    session's (``postgres_server_url`` decides whether a missing one skips or fails)."""
    async with scratch_postgres_database("tooltrail_mem") as url:
        yield url


@pytest.mark.postgres
async def test_the_migration_keeps_old_notes_and_names_their_run_postgres(
    fresh_postgres: str,
) -> None:
    await upgrade(fresh_postgres, _BEFORE)
    await _fill_before(fresh_postgres)
    await upgrade(fresh_postgres)
    await _check_after(fresh_postgres)
