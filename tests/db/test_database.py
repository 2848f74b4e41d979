"""The audit database on real SQLite and PostgreSQL: migrations, idempotent writes, queries."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import text

from tooltrail import ConfigurationError, DatabaseSchemaError
from tooltrail.core.wire import AuditEvent, Flush, MemoryEntry, TurnRecord
from tooltrail.db.engine import normalize_url
from tooltrail.db.migrate import alembic_config, check_schema, current_revision, upgrade
from tooltrail.db.store import AuditStore

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def flush(turn_id: str, seqs: range, *, status: str = "running", memory: bool = False) -> Flush:
    turn = TurnRecord(turn_id=turn_id, session_id="s", status=status, started_at=T0)  # type: ignore[arg-type]
    if status != "running":
        turn.ended_at = T0 + timedelta(seconds=1)
    return Flush(
        turn_id=turn_id,
        session_id="s",
        turn=turn,
        events=[
            AuditEvent(
                seq=seq,
                kind="tool_post",
                tool_call_id=f"c{seq}",
                tool_name="t",
                attempt=0,
                payload={"output": "é" * 10 + str(seq), "is_error": seq % 2 == 1},
                created_at=T0 + timedelta(milliseconds=seq),
            )
            for seq in seqs
        ],
        memory=[
            MemoryEntry(
                content=f"tool=t; input={{}}; result={seq}",
                tool_call_id=f"c{seq}",
                created_at=T0,
                seq=seq,
                turn_id=turn_id,
                session_id="s",
            )
            for seq in seqs
        ]
        if memory
        else [],
    )


def test_migrations_have_a_single_head() -> None:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    assert len(heads) == 1


def test_plain_and_driver_urls_are_normalised() -> None:
    assert normalize_url("sqlite:///x.db").drivername == "sqlite+aiosqlite"
    assert normalize_url("sqlite+aiosqlite:///x.db").drivername == "sqlite+aiosqlite"
    assert normalize_url("postgresql://u@h/db").drivername == "postgresql+asyncpg"
    assert normalize_url("postgresql+psycopg://u@h/db").drivername == "postgresql+asyncpg"
    assert normalize_url("postgres://u@h/db").drivername == "postgresql+asyncpg"
    with pytest.raises(ConfigurationError, match="unsupported database URL"):
        normalize_url("mysql://u:secret@h/db")


async def test_upgrade_from_empty_and_models_match_migrations_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nested' / 'fresh.db'}"
    with pytest.raises(DatabaseSchemaError, match="tooltrail db upgrade"):
        await check_schema(url)
    await upgrade(url)
    await check_schema(url)
    await _alembic_check(url)
    await _downgrade_and_upgrade_again(url)


@pytest.mark.postgres
async def test_upgrade_from_empty_and_models_match_migrations_postgres(
    postgres_server_url: str,
) -> None:
    # postgres_server_url is an empty database; the migrated fixture shares it, so go back
    # to base first in case another test migrated it already.
    await _downgrade(postgres_server_url, "base")
    assert await current_revision(postgres_server_url) is None
    await upgrade(postgres_server_url)
    await check_schema(postgres_server_url)
    await _alembic_check(postgres_server_url)
    await _downgrade_and_upgrade_again(postgres_server_url)


async def _alembic_check(url: str) -> None:
    store = AuditStore(url)
    try:
        async with store.engine.connect() as conn:

            def check(sync_conn: object) -> None:
                cfg = alembic_config(url)
                cfg.attributes["connection"] = sync_conn
                command.check(cfg)  # raises when the models and the migrations differ

            await conn.run_sync(check)
    finally:
        await store.close()


async def _downgrade(url: str, revision: str) -> None:
    store = AuditStore(url)
    try:
        async with store.engine.begin() as conn:

            def down(sync_conn: object) -> None:
                cfg = alembic_config(url)
                cfg.attributes["connection"] = sync_conn
                command.downgrade(cfg, revision)

            await conn.run_sync(down)
    finally:
        await store.close()


async def _downgrade_and_upgrade_again(url: str) -> None:
    await _downgrade(url, "base")
    assert await current_revision(url) is None
    await upgrade(url)
    await check_schema(url)


async def test_writes_are_idempotent_per_turn_and_seq(db_url: str) -> None:
    store = AuditStore(db_url)
    turn_id = f"idem-{datetime.now(UTC).timestamp()}"
    try:
        await store.write_flush(flush(turn_id, range(0, 3), memory=True))
        # A re-run activity sends the same records again, plus newer ones.
        await store.write_flush(flush(turn_id, range(0, 5), memory=True))
        await store.write_flush(flush(turn_id, range(3, 5), memory=True))
        events = await store.events(turn_id)
        memory = [m for m in await store.memory("s") if m.turn_id == turn_id]
    finally:
        await store.close()
    assert [e.seq for e in events] == [0, 1, 2, 3, 4]
    assert events[0].payload == {"output": "é" * 10 + "0", "is_error": False}
    assert events[0].created_at == T0
    assert [m.seq for m in memory] == [0, 1, 2, 3, 4]


async def test_turn_status_moves_forward_only(db_url: str) -> None:
    store = AuditStore(db_url)
    turn_id = f"status-{datetime.now(UTC).timestamp()}"
    try:
        await store.write_flush(flush(turn_id, range(0, 1)))
        await store.write_flush(flush(turn_id, range(1, 2), status="completed"))
        # A late, stale write of the running state must not undo the completion.
        await store.write_flush(flush(turn_id, range(0, 1)))
        await store.write_flush(flush(turn_id, range(2, 3), status="failed"))
        row = await store.turn(turn_id)
    finally:
        await store.close()
    assert row is not None
    assert row.status == "completed"
    assert row.ended_at == T0 + timedelta(seconds=1)


async def test_memory_failure_is_logged_and_events_survive(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = AuditStore(db_url)
    turn_id = f"mem-{datetime.now(UTC).timestamp()}"
    try:
        async with store.engine.begin() as conn:
            await conn.execute(text("ALTER TABLE memory_entry RENAME TO memory_entry_away"))
        try:
            with caplog.at_level(logging.WARNING, logger="tooltrail.db"):
                await store.write_flush(flush(turn_id, range(0, 2), memory=True))
        finally:
            async with store.engine.begin() as conn:
                await conn.execute(text("ALTER TABLE memory_entry_away RENAME TO memory_entry"))
        events = await store.events(turn_id)
    finally:
        await store.close()
    assert [e.seq for e in events] == [0, 1]
    assert any("memory store failed" in r.getMessage() for r in caplog.records)


async def test_turn_queries_filter(db_url: str) -> None:
    store = AuditStore(db_url)
    stamp = datetime.now(UTC).timestamp()
    ok_id, bad_id = f"q-ok-{stamp}", f"q-bad-{stamp}"
    try:
        ok = flush(ok_id, range(0, 1), status="completed")
        ok.turn.session_id = f"qs-{stamp}"
        bad = flush(bad_id, range(0, 2), status="completed")
        bad.turn.session_id = f"qs-{stamp}"
        bad.turn.started_at = T0 + timedelta(minutes=5)
        bad.events[1].tool_name = "other"
        await store.write_flush(ok)
        await store.write_flush(bad)
        session = f"qs-{stamp}"
        everything = await store.turns(session_id=session)
        errors = await store.turns(session_id=session, errors_only=True)
        by_tool = await store.turns(session_id=session, tool="other")
        early = await store.turns(session_id=session, until=T0 + timedelta(minutes=1))
        late = await store.turns(session_id=session, since=T0 + timedelta(minutes=1))
        failed = await store.turns(session_id=session, status="failed")
    finally:
        await store.close()
    assert [t.turn_id for t in everything] == [bad_id, ok_id]
    assert everything[0].error_results == 1 and everything[0].event_count == 2
    assert [t.turn_id for t in errors] == [bad_id]
    assert [t.turn_id for t in by_tool] == [bad_id]
    assert [t.turn_id for t in early] == [ok_id]
    assert [t.turn_id for t in late] == [bad_id]
    assert failed == []
