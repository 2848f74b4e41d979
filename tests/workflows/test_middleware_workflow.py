"""Middleware in the real pipeline (spec §12, §13; scenarios 9, 21, 22, 45)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from tests.conftest import StackFactory
from tooltrail import AlwaysRecoverable, FixedDelay, Host, RunConfig, ToolCall, ToolError, tool
from tooltrail.pipeline.middleware import (
    MiddlewareCall,
    MiddlewareResult,
    Next,
    RedactingMiddleware,
    TimeoutMiddleware,
    UnknownToolMiddleware,
)

flaky_runs: list[int] = []


@tool
async def t() -> str:
    """Take five seconds."""
    await asyncio.sleep(5)
    return "late"


@tool
def bash(command: str = "ls") -> str:
    """Pretend to run a command."""
    return f"ran {command}"


@tool
def flaky() -> str:
    """Fail once, then work."""
    flaky_runs.append(1)
    if len(flaky_runs) == 1:
        raise ToolError("first time fails")
    return "second time works"


class GarbageIds:
    async def __call__(self, call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        result = await call_next(call)
        return replace(result, tool_call_id="made_up")


class RenameTo:
    def __init__(self, target: str) -> None:
        self.target = target

    async def __call__(self, call: MiddlewareCall, call_next: Next) -> MiddlewareResult:
        return await call_next(replace(call, tool_name=self.target))


async def test_timeout_middleware(stack: StackFactory) -> None:
    async with stack(Host([t], middleware=[TimeoutMiddleware(1)])) as tt:
        turn = await tt.run_turn([ToolCall("c", "t", {})], session_id="m")
    result = turn.results[0]
    assert (result.output, result.is_error, result.duration_ms) == (
        "Tool 't' timed out after 1s",
        True,
        1000.0,
    )


async def test_did_you_mean(stack: StackFactory) -> None:
    async with stack(Host([bash], middleware=[UnknownToolMiddleware()])) as tt:
        turn = await tt.run_turn(
            [ToolCall("a", "basj", {}), ToolCall("b", "xyz", {})],
            session_id="m",
            advertised=["bash", "basj", "xyz"],
        )
    assert [r.output for r in turn.results] == [
        "Tool not found: basj. Available: bash. Did you mean 'bash'?",
        "Tool not found: xyz. Available: bash",
    ]


async def test_ids_returned_by_middleware_are_overridden(stack: StackFactory) -> None:
    flaky_runs.clear()
    host = Host([flaky], middleware=[GarbageIds(), GarbageIds()], reflector=AlwaysRecoverable())
    async with stack(host) as tt:
        turn = await tt.run_turn(
            [ToolCall("model_id", "flaky", {})],
            session_id="m",
            config=RunConfig(recovery=FixedDelay(3, 0)),
        )
        events = await tt.audit(turn.turn_id)
    assert [(r.tool_call_id, r.output) for r in turn.results] == [("model_id", "second time works")]
    attempt_events = [
        (e.kind, e.tool_call_id) for e in events if e.kind in {"tool_pre", "tool_post"}
    ]
    assert attempt_events == [
        ("tool_pre", "model_id"),
        ("tool_post", "model_id"),
        ("tool_pre", "model_id"),
        ("tool_post", "model_id"),
    ]


async def test_a_renaming_layer_changes_the_resolved_name(stack: StackFactory) -> None:
    @tool
    def old_name() -> str:
        return "old"

    async with stack(Host([old_name, bash], middleware=[RenameTo("bash")])) as tt:
        turn = await tt.run_turn([ToolCall("c", "old_name", {})], session_id="m")
        events = await tt.audit(turn.turn_id)
    assert (turn.results[0].output, turn.results[0].resolved_tool_name) == ("ran ls", "bash")
    post = next(e for e in events if e.kind == "tool_post")
    assert (post.tool_name, post.payload["resolved_tool_name"]) == ("old_name", "bash")


async def test_redaction_reaches_the_model_and_the_audit_trail(stack: StackFactory) -> None:
    @tool
    def leak(token: str) -> str:
        return f"token is {token}"

    redact = RedactingMiddleware({"token": r"sk-[a-z0-9]+"})
    async with stack(Host([leak], middleware=[redact])) as tt:
        turn = await tt.run_turn(
            [ToolCall("c", "leak", {"token": "sk-abc123"})], session_id="redacted"
        )
        events = await tt.audit(turn.turn_id)
        memory = await tt.memory("redacted")
    assert turn.results[0].output == "token is [REDACTED:token]"
    stored = str([e.payload for e in events]) + str([m.content for m in memory])
    assert "sk-abc123" not in stored
    assert "[REDACTED:token]" in stored


async def test_permission_output_limit_and_verify_in_order(stack: StackFactory) -> None:
    from tooltrail.pipeline.middleware import (
        OutputLimitMiddleware,
        PermissionAllow,
        PermissionDeny,
        PermissionMiddleware,
        PermissionModify,
        VerifyMiddleware,
    )

    def policy(call: MiddlewareCall) -> object:
        if call.arguments.get("command") == "rm -rf /":
            return PermissionDeny("denied: destructive command")
        if call.arguments.get("command") == "ls":
            return PermissionModify({"command": "ls -la"})
        return PermissionAllow()

    def check(call: MiddlewareCall, result: MiddlewareResult) -> tuple[bool, str]:
        return ("ran" in str(result.output), "output mentions the command")

    layers = [OutputLimitMiddleware(60), PermissionMiddleware(policy), VerifyMiddleware(check)]
    async with stack(Host([bash], middleware=layers)) as tt:
        turn = await tt.run_turn(
            [
                ToolCall("a", "bash", {"command": "rm -rf /"}),
                ToolCall("b", "bash", {"command": "ls"}),
                ToolCall("c", "bash", {"command": "echo " + "x" * 80}),
            ],
            session_id="m",
        )
    denied, modified, limited = turn.results
    assert (denied.output, denied.is_error, denied.duration_ms) == (
        "Permission denied: destructive command for tool 'bash'",
        True,
        0.0,
    )
    assert modified.output == "ran ls -la\n\n[verify] passed: output mentions the command"
    assert len(limited.output) == 60 and limited.output.endswith("\n[truncated]")
