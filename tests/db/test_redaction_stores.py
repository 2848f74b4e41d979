"""Redaction covers every store of the audit database (issue 22, finding 6).

With a ``RedactingMiddleware`` on the host, no table holds the secret afterwards: not the
events, not memory, not the turn's error (a loop stop names the call's arguments), not the
session's state (the loop window keeps params), not the stored copy of a large output or of
the tool's raw value. On a real Temporal server, SQLite and PostgreSQL.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from tests.conftest import StackFactory
from tooltrail import (
    Host,
    LoopDetected,
    LoopDetection,
    RedactingMiddleware,
    RunConfig,
    ToolCall,
    tool,
)
from tooltrail.db.orm import Base

SECRET = "SECRET-hunter2"


@tool
def lookup(token: str) -> str:
    """Look a token up."""
    return f"found {token}"


@tool
def dump(token: str) -> str:
    """Return a large text that holds the token."""
    return (token + " ") * 40_000


async def every_stored_text(tt: object) -> str:
    store = tt.store  # type: ignore[attr-defined]
    texts = []
    async with store.engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            for row in (await conn.execute(select(table))).all():
                texts.append(repr(tuple(row)))
    return "\n".join(texts)


async def test_no_store_keeps_a_redacted_secret(stack: StackFactory, db_url: str) -> None:
    host = Host([lookup, dump], middleware=[RedactingMiddleware({"token": r"SECRET-\w+"})])
    config = RunConfig(detection=LoopDetection(loop_threshold=2, stop_threshold=3))
    async with stack(host, database_url=db_url) as tt:
        big = await tt.run_turn([ToolCall("d", "dump", {"token": SECRET})], session_id="red")
        assert big.results[0].output.startswith("[REDACTED:token] ")
        events = await tt.audit(big.turn_id)
        assert any(e.payload.get("output_ref") for e in events if e.kind == "tool_post")
        with pytest.raises(LoopDetected) as stopped:
            await tt.run_turn(
                [ToolCall(f"l{n}", "lookup", {"token": SECRET}) for n in range(4)],
                session_id="red",
                config=config,
            )
        assert SECRET in str(stopped.value), "the caller is told in full; the stores are not"
        stored = await every_stored_text(tt)
        state = await tt.store.session_state("red")
    assert "[REDACTED:token]" in stored
    assert SECRET not in stored
    assert state.detector.warned, "the stopped operation is remembered (redacted)"
