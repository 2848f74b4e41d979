"""Refusals that never reached a tool's body do not count toward its breaker (a decision on
pipeline spec §11.3, docs/guide/pipeline.md), on a real server and on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import select

from tests.conftest import StackFactory
from tooltrail import (
    AccessConfig,
    AuthorityScope,
    CircuitBreaker,
    Host,
    Principal,
    ToolCall,
    ToolError,
    tool,
)
from tooltrail.activities.tool_execution import reached_body
from tooltrail.core.wire import Ran
from tooltrail.db.orm import ToolHealthRow

OPEN = "tool temporarily unavailable: circuit breaker open"


def test_which_statuses_reached_the_body() -> None:
    def ran(status: str | None) -> Ran:
        return Ran(
            output="x",
            is_error=True,
            resolved_tool_name="t",
            started_at=datetime.now(UTC),
            finished_at=datetime.now(UTC),
            dispatch=None if status is None else {"status": status},
        )

    refused = ["access_denied", "guardrail_violation", "idempotency_busy"]
    assert [reached_body(ran(s)) for s in refused] == [False] * 3
    assert [reached_body(ran(s)) for s in ("ok", "tool_error", "cache_hit", None)] == [True] * 4


async def _health(tt: object, name: str) -> tuple[str, int] | None:
    async with tt.store.sessions() as session:  # type: ignore[attr-defined]
        row = (
            await session.execute(
                select(ToolHealthRow.state, ToolHealthRow.consecutive_failures).where(
                    ToolHealthRow.tool_name == name
                )
            )
        ).first()
    return None if row is None else (row[0], row[1])


async def test_guardrail_violations_do_not_trip_the_breaker(
    stack: StackFactory, db_url: str
) -> None:
    name = f"count_{uuid.uuid4().hex[:8]}"
    ran: list[int] = []

    @tool(name=name)
    def count(n: int) -> str:
        ran.append(n)
        if n < 0:
            raise ToolError("negative")
        return str(n)

    host = Host([count], circuit_breaker=CircuitBreaker(failure_threshold=2, recovery_s=600))
    async with stack(host, database_url=db_url) as tt:
        bad = [ToolCall(f"b{i}", name, {"n": "not a number"}) for i in range(4)]
        turn = await tt.run_turn([*bad, ToolCall("ok", name, {"n": 1})], session_id="br-1")
        after_refusals = await _health(tt, name)
        # The body's own failures still count: two of them open the breaker.
        tripped = await tt.run_turn(
            [ToolCall(f"f{i}", name, {"n": -1}) for i in range(3)], session_id="br-2"
        )
        after_failures = await _health(tt, name)
    assert all(r.output.startswith("guardrail violation:") for r in turn.results[:4])
    assert turn.results[4].output == "1"
    assert after_refusals == ("closed", 0)
    assert [r.output for r in tripped.results] == ["negative", "negative", OPEN]
    assert after_failures is not None and after_failures[0] == "open"
    assert ran == [1, -1, -1]


async def test_access_denials_do_not_trip_the_breaker(stack: StackFactory, db_url: str) -> None:
    name = f"secret_{uuid.uuid4().hex[:8]}"

    @tool(name=name)
    def secret() -> str:
        return "s"

    host = Host(
        [secret],
        circuit_breaker=CircuitBreaker(failure_threshold=1, recovery_s=600),
        access=AccessConfig(
            principal=Principal("svc"), authority=AuthorityScope(allowed_tools={"other"})
        ),
    )
    async with stack(host, database_url=db_url) as tt:
        turn = await tt.run_turn([ToolCall(f"d{i}", name, {}) for i in range(3)], session_id="br-3")
        health = await _health(tt, name)
    assert all(r.output.startswith("access denied:") for r in turn.results)
    # The gate let each call through (nothing open), and nothing was recorded against it.
    assert health in (None, ("closed", 0))
