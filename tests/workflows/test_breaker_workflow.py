"""The shared circuit breaker in the pipeline (spec §11.3, scenarios 30-34), on a real server."""

from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import select

from tests.conftest import StackFactory
from tooltrail import (
    AlwaysRecoverable,
    CircuitBreaker,
    Host,
    RetryForever,
    RunConfig,
    Tool,
    ToolCall,
    ToolError,
    tool,
)
from tooltrail.db.orm import ToolHealthRow

OPEN = "tool temporarily unavailable: circuit breaker open"


def scripted(
    outcomes: list[bool], *, name: str = "svc", safe: bool = False, seconds: float = 0.0
) -> tuple[Tool, list[int]]:
    """A tool that succeeds or fails following ``outcomes`` (then keeps failing).

    Each execution takes ``seconds``.
    """
    executions: list[int] = []

    def body() -> str:
        executions.append(1)
        time.sleep(seconds)
        ok = outcomes[len(executions) - 1] if len(executions) <= len(outcomes) else False
        if not ok:
            raise ToolError(f"failure {len(executions)}")
        return f"success {len(executions)}"

    return tool(name=name, concurrent_safe=safe)(body), executions


async def test_an_open_breaker_refuses_the_next_turn(stack: StackFactory) -> None:
    svc, executions = scripted([False])
    host = Host([svc], circuit_breaker=CircuitBreaker(failure_threshold=1, recovery_s=60))
    async with stack(host) as tt:
        first = await tt.run_turn([ToolCall("a", "svc", {})], session_id="b1")
        second = await tt.run_turn([ToolCall("b", "svc", {})], session_id="b1")
        events = await tt.audit(second.turn_id)
    assert first.results[0].output == "failure 1"
    assert (second.results[0].output, second.results[0].duration_ms) == (OPEN, 0.0)
    assert len(executions) == 1
    assert [e.kind for e in events if e.tool_call_id == "b"] == [
        "tool_call_received",
        "tool_pre",
        "breaker_refused",
        "tool_post",
    ]


async def test_a_closed_breaker_with_a_poor_score_still_dispatches(stack: StackFactory) -> None:
    svc, executions = scripted([False, False, True, True])
    host = Host([svc], circuit_breaker=CircuitBreaker(failure_threshold=5))
    async with stack(host) as tt:
        turn = await tt.run_turn([ToolCall(f"c{i}", "svc", {}) for i in range(4)], session_id="b2")
    assert len(executions) == 4
    assert [r.is_error for r in turn.results] == [True, True, False, False]


async def test_an_open_breaker_refuses_recovery_retries_too(stack: StackFactory) -> None:
    svc, executions = scripted([])
    host = Host(
        [svc],
        circuit_breaker=CircuitBreaker(failure_threshold=1, recovery_s=60),
        reflector=AlwaysRecoverable(),
    )
    async with stack(host) as tt:
        turn = await tt.run_turn(
            [ToolCall("c", "svc", {})], session_id="b3", config=RunConfig(recovery=RetryForever())
        )
    assert len(executions) == 1
    assert (turn.results[0].output, turn.results[0].is_error) == (OPEN, True)


async def test_a_failed_probe_retrips_then_a_good_one_closes(stack: StackFactory) -> None:
    svc, executions = scripted([False, False, True, True])
    host = Host([svc], circuit_breaker=CircuitBreaker(failure_threshold=1, recovery_s=0))
    async with stack(host) as tt:
        turn = await tt.run_turn([ToolCall(f"c{i}", "svc", {}) for i in range(4)], session_id="b4")
    assert len(executions) == 4
    assert [r.output for r in turn.results] == ["failure 1", "failure 2", "success 3", "success 4"]


async def test_concurrent_calls_share_one_recovery_probe(stack: StackFactory) -> None:
    # The probe takes a while: the other call asks the gate while the probe is in flight.
    svc, executions = scripted([False, True, True], safe=True, seconds=0.5)
    host = Host(
        [svc], circuit_breaker=CircuitBreaker(failure_threshold=1, recovery_s=0, probe_timeout_s=60)
    )
    async with stack(host) as tt:
        await tt.run_turn([ToolCall("trip", "svc", {})], session_id="b5")
        turn = await tt.run_turn(
            [ToolCall("x", "svc", {}), ToolCall("y", "svc", {})],
            session_id="b5",
            config=RunConfig(dispatch="parallel"),
        )
    outputs = sorted(r.output for r in turn.results)
    assert outputs == ["success 2", OPEN]
    assert len(executions) == 2


async def test_never_advertised_tools_create_no_ghost_breaker(stack: StackFactory) -> None:
    svc, _ = scripted([True])
    async with stack(Host([svc], circuit_breaker=CircuitBreaker())) as tt:
        turn = await tt.run_turn(
            [ToolCall("g", "ghost", {}), ToolCall("s", "svc", {})], session_id="b6"
        )
        async with tt.store.sessions() as session:
            names = list(await session.scalars(select(ToolHealthRow.tool_name)))
    assert turn.results[0].output == "tool 'ghost' is not available"
    assert names == ["svc"]


@pytest.mark.postgres
async def test_two_workers_on_postgresql_agree(stack: StackFactory, postgres_url: str) -> None:
    name = f"svc_{uuid.uuid4().hex[:8]}"
    svc, executions = scripted([False], name=name)
    breaker = CircuitBreaker(failure_threshold=1, recovery_s=60)
    async with stack(Host([svc], circuit_breaker=breaker), database_url=postgres_url) as first:
        tripped = await first.run_turn([ToolCall("a", name, {})], session_id="b7")
    twin, twin_executions = scripted([True], name=name)
    async with stack(Host([twin], circuit_breaker=breaker), database_url=postgres_url) as second:
        refused = await second.run_turn([ToolCall("b", name, {})], session_id="b7")
    assert tripped.results[0].output == "failure 1"
    assert refused.results[0].output == OPEN
    assert (len(executions), len(twin_executions)) == (1, 0)
