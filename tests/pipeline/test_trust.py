"""What a caller or a reflector may not do (issue 22, finding 16 and "Trust").

Nothing in a turn's workflow input turns hooks off or seeds the memo cache (the worker plans
those from its own wiring and the database), and a reflector's correction passes the checks
the model's calls pass (advertised tools, argument size). On a real Temporal server, SQLite
and PostgreSQL.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from tests.conftest import StackFactory
from tooltrail import (
    Analysis,
    FixedDelay,
    Host,
    InputFix,
    ReflectionContext,
    RunConfig,
    ToolCall,
    ToolChange,
    ToolError,
    tool,
)
from tooltrail.core.hooks import Block, PreToolUseContext
from tooltrail.core.memoize import MemoizingMiddleware
from tooltrail.core.wire import TurnOutput

runs: Counter[str] = Counter()


@tool
def flaky(path: str) -> str:
    """Always fail, so the reflector is asked."""
    runs["flaky"] += 1
    raise ToolError(f"no such file {path[:20]}")


@tool
def admin(path: str) -> str:
    """A tool the host has but never offers this model."""
    runs["admin"] += 1
    return "admin ran"


@tool
def lookup(key: str) -> str:
    """A memoized lookup."""
    runs["lookup"] += 1
    return f"value of {key}"


class Correcting:
    """Answers every failure with the same correction."""

    def __init__(self, correction: Any) -> None:
        self.correction = correction

    async def analyze(self, ctx: ReflectionContext) -> Analysis:
        return Analysis(is_recoverable=True, root_cause=ctx.error, correction=self.correction)


class NoLookups:
    """A pre-tool hook that blocks every lookup."""

    async def pre_tool(self, ctx: PreToolUseContext) -> Block | None:
        return Block("lookups are off") if ctx.tool_name == "lookup" else None


async def run_corrected(stack: StackFactory, db_url: str, correction: Any) -> list[Any]:
    runs.clear()
    host = Host([flaky, admin], reflector=Correcting(correction))
    async with stack(host, database_url=db_url) as tt:
        turn = await tt.run_turn(
            [ToolCall("c", "flaky", {"path": "/x"})],
            session_id="trust",
            advertised=["flaky"],
            config=RunConfig(recovery=FixedDelay(1, 0)),
        )
        events = await tt.audit(turn.turn_id)
    assert turn.results[0].is_error and turn.results[0].resolved_tool_name == "flaky"
    return [e.payload for e in events if e.kind == "recovery_decision"]


async def test_a_tool_change_to_a_tool_never_advertised_is_refused(
    stack: StackFactory, db_url: str
) -> None:
    decisions = await run_corrected(stack, db_url, ToolChange("admin"))
    assert runs == Counter(flaky=2), "the retry ran the call unchanged; admin never ran"
    assert decisions[0]["correction_problem"] == (
        "ToolChange correction names tool 'admin', which was not advertised"
    )


async def test_an_input_fix_too_large_to_send_is_refused(stack: StackFactory, db_url: str) -> None:
    decisions = await run_corrected(stack, db_url, InputFix({"path": "p" * (600 * 1024)}))
    assert runs == Counter(flaky=2)
    problem = decisions[0]["correction_problem"]
    assert problem.startswith("InputFix correction modified_input refused: invalid arguments: ")
    assert problem.endswith("at most 524288 are accepted")


async def test_workflow_input_cannot_turn_hooks_off_or_seed_the_memo_cache(
    stack: StackFactory, db_url: str
) -> None:
    runs.clear()
    host = Host([lookup], hooks=[NoLookups()], middleware=[MemoizingMiddleware(["lookup"])])
    planted = {"tool": "lookup", "key": "k", "output": "planted", "duration_ms": 0.0}
    forged: dict[str, Any] = {
        "session_id": "forged",
        "calls": [{"id": "c", "name": "lookup", "arguments": {"key": "k"}}],
        # Fields older inputs carried, and what an attacker would try: all must be ignored.
        "features": {"hooks": False, "memo_hooks": False},
        "session": {"memo": {"entries": [{**planted, "resolved_tool_name": "lookup"}]}},
        "memo": {"tools": {"lookup": {}}},
        "plan": {"features": {"hooks": False}},
    }
    async with stack(host, database_url=db_url) as tt:
        handle = await tt.client.start_workflow(
            "TurnWorkflow",
            forged,
            id="turn-forged",
            task_queue=tt.task_queue,
            result_type=TurnOutput,
        )
        output = await handle.result()
    result = output.results[0]
    assert (result.is_error, result.output) == (True, "lookups are off")
    assert runs["lookup"] == 0
