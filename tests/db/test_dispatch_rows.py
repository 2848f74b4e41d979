"""Spec §8 in real turns: every dispatch past step 1 leaves exactly one dispatch row in the
trail, whatever the outcome (a body that raised, ``IdempotencyKeyError``, ``CachedToolError``).

Real Temporal server, SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from tests.conftest import StackFactory
from tooltrail import Host, Idempotency, ToolCall, ToolError, tool
from tooltrail.core.wire import AuditEvent
from tooltrail.pipeline.dispatcher import NullAuditLog, ToolDispatcher, dispatch_record_of


@tool
def refuses(text: str) -> str:
    """Fail softly."""
    raise ToolError(f"no {text}")


@tool
def panics(text: str) -> str:
    """Fail with a bug."""
    raise RuntimeError(f"bug {text}")


def _bad_key(model: BaseModel) -> str:
    raise ValueError("no key for this")


@tool(idempotent=Idempotency(strategy="explicit", key=_bad_key))
def keyless(text: str) -> str:
    """An idempotent tool whose key function fails."""
    return text


@tool(idempotent=Idempotency(cache_failures=True))
def flaky_once(text: str) -> str:
    """An idempotent tool whose failure is cached."""
    raise ToolError(f"down for {text}")


def dispatch_rows(events: list[AuditEvent]) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        if event.kind == "tool_post":
            assert event.tool_call_id is not None
            rows.setdefault(event.tool_call_id, []).append(event.payload.get("dispatch") or {})
    return rows


async def test_failed_dispatches_have_their_rows(stack: StackFactory, db_url: str) -> None:
    host = Host([refuses, panics, keyless, flaky_once])
    async with stack(host, database_url=db_url) as tt:
        first = await tt.run_turn(
            [
                ToolCall("r1", "refuses", {"text": "a"}),
                ToolCall("p1", "panics", {"text": "b"}),
                ToolCall("k1", "keyless", {"text": "c"}),
                ToolCall("f1", "flaky_once", {"text": "d"}),
            ],
            session_id="rows",
        )
        # The same failure again: served from the idempotency store (CachedToolError).
        second = await tt.run_turn([ToolCall("f2", "flaky_once", {"text": "d"})], session_id="r2")
        rows = dispatch_rows(await tt.audit(first.turn_id))
        hit = dispatch_rows(await tt.audit(second.turn_id))
    assert all(r.is_error for r in first.results + second.results)
    assert sorted(rows) == ["f1", "k1", "p1", "r1"]
    # Every attempt (each a dispatch past step 1) has its own row: before, a dispatch that
    # raised had none.
    for call_id, records in {**rows, **hit}.items():
        assert all(record.get("call_id") == call_id for record in records), records
    assert {r["status"] for r in rows["r1"]} == {"tool_error"}
    assert rows["r1"][0]["text"] == "ToolError: no a"
    assert rows["p1"][0]["text"] == "RuntimeError: bug b"
    assert rows["k1"][0]["text"].startswith("IdempotencyKeyError")
    assert rows["k1"][0]["idempotency_key"] is None
    assert rows["f1"][0]["status"] == "tool_error" and rows["f1"][0]["idempotency_key"]
    assert {(r["status"], r["source_call_id"]) for r in hit["f2"]} == {("tool_error", "f1")}


async def test_a_worker_dispatcher_keeps_no_records() -> None:
    # build_worker wires NullAuditLog: a worker's memory does not grow with its calls.
    dispatcher = ToolDispatcher(Host([refuses]).registry, audit=NullAuditLog())
    with pytest.raises(ToolError) as raised:
        await dispatcher.dispatch("refuses", {"text": "x"}, call_id="c")
    record = dispatch_record_of(raised.value)
    assert record is not None and (record.status, record.call_id) == ("tool_error", "c")
    assert vars(dispatcher.audit) == {}
