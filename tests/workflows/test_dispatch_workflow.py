"""The dispatcher inside real turns: access gate, guardrails, idempotency, dynamic tools."""

from __future__ import annotations

from typing import Annotated, Any

import pytest

from tests.conftest import StackFactory
from tooltrail import (
    AccessConfig,
    AuthorityScope,
    Guard,
    Host,
    Principal,
    ToolCall,
    ToolContext,
    ToolRegistry,
    UnknownToolError,
    tool,
)
from tooltrail.core.wire import TurnInput

side_effects: list[Any] = []


@tool
def read_file(path: str) -> str:
    """Read."""
    return f"read {path}"


@tool
def admin_op(principal: str = "") -> str:
    """Something only admins may do."""
    side_effects.append("admin")
    return "done"


@tool
def short(text: Annotated[str, Guard(max_length=5, blocked_patterns=(r"secret",))]) -> str:
    """A guarded argument."""
    side_effects.append(text)
    return text


@tool(idempotent=True)
def send_email(ctx: ToolContext, to: str) -> str:
    """Send (once)."""
    side_effects.append((to, ctx.idempotency_key, getattr(ctx.principal, "id", None)))
    return f"sent to {to}"


ACCESS = AccessConfig(
    principal=Principal("p1"), authority=AuthorityScope(allowed_tools={"read_*", "short", "send_*"})
)


@pytest.fixture(autouse=True)
def reset() -> None:
    side_effects.clear()


async def test_the_access_gate_uses_host_identity_only(stack: StackFactory) -> None:
    host = Host([read_file, admin_op], access=ACCESS)
    async with stack(host) as tt:
        turn = await tt.run_turn(
            [
                ToolCall("a", "read_file", {"path": "/x"}),
                ToolCall("b", "admin_op", {"principal": "root"}),
            ],
            session_id="acc",
        )
        events = await tt.audit(turn.turn_id)
        # A turn started with a smuggled principal field: the wire model drops it.
        raw = TurnInput(
            session_id="acc", calls=[ToolCall("c", "admin_op", {})], advertised=["admin_op"]
        ).model_dump(mode="json")
        raw["principal"] = "root"
        smuggled = await tt.client.execute_workflow(
            "TurnWorkflow", raw, id="smuggled-turn", task_queue=tt.task_queue, result_type=dict
        )
        allowed = await tt.authorize_tool("read_file", {"path": "/x"})
        denied = await tt.authorize_tool("admin_op", {"principal": "root"})
        with pytest.raises(UnknownToolError):
            await tt.authorize_tool("nope")
    denial = "access denied: tool 'admin_op' is outside the authority of principal 'p1'"
    assert [(r.output, r.is_error) for r in turn.results] == [("read /x", False), (denial, True)]
    assert turn.results[1].duration_ms == 0.0
    assert smuggled["results"][0]["output"] == denial
    assert side_effects == []
    post = next(e for e in events if e.kind == "tool_post" and e.tool_call_id == "b")
    assert (post.payload["dispatch"]["status"], post.payload["dispatch"]["principal_id"]) == (
        "access_denied",
        "p1",
    )
    assert (allowed.allowed, denied.allowed, denied.error_text) == (True, False, denial)


async def test_guardrails_reject_without_running(stack: StackFactory) -> None:
    async with stack(Host([short])) as tt:
        turn = await tt.run_turn(
            [
                ToolCall("a", "short", {"text": "toolong"}),
                ToolCall("b", "short", {"text": "secret"}),
                ToolCall("c", "short", {"text": "ok", "extra": 1}),
            ],
            session_id="g",
        )
        events = await tt.audit(turn.turn_id)
    assert [r.output for r in turn.results] == [
        "guardrail violation: text: longer than 5 characters",
        "guardrail violation: text: matches a blocked pattern",
        "ok",
    ]
    assert side_effects == ["ok"]
    posts = {e.tool_call_id: e.payload["dispatch"] for e in events if e.kind == "tool_post"}
    assert posts["a"]["status"] == "guardrail_violation" and "toolong" not in posts["a"]["text"]
    assert posts["c"]["ignored_arguments"] == ["extra"]
    assert posts["c"]["effective_arguments"] == '{"text":"ok"}'


async def test_an_idempotent_side_effect_happens_once_across_turns(stack: StackFactory) -> None:
    async with stack(Host([send_email], access=ACCESS)) as tt:
        first = await tt.run_turn([ToolCall("c1", "send_email", {"to": "a@b"})], session_id="i")
        second = await tt.run_turn([ToolCall("c2", "send_email", {"to": "a@b"})], session_id="i")
        events = await tt.audit(second.turn_id)
    assert [first.results[0].output, second.results[0].output] == ["sent to a@b"] * 2
    assert len(side_effects) == 1
    to, key, principal = side_effects[0]
    assert (to, principal) == ("a@b", "p1") and key is not None and len(key) == 64
    record = next(e for e in events if e.kind == "tool_post").payload["dispatch"]
    assert (record["status"], record["source_call_id"], record["call_id"]) == (
        "cache_hit",
        "c1",
        "c2",
    )


async def test_dynamic_tools_get_their_raw_arguments(stack: StackFactory) -> None:
    registry = ToolRegistry()
    seen: list[dict[str, Any]] = []

    async def handler(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        seen.append(arguments)
        return {"echo": arguments}

    registry.register_dynamic(
        "remote_echo",
        description="A remote tool.",
        parameters={"type": "object", "properties": {"x": {"type": "string", "maxLength": 3}}},
        handler=handler,
    )
    async with stack(Host(registry)) as tt:
        turn = await tt.run_turn(
            [ToolCall("d", "remote_echo", {"x": "way too long", "extra": 1})], session_id="dyn"
        )
    assert seen == [{"x": "way too long", "extra": 1}]
    assert turn.results[0].output == '{"echo":{"x":"way too long","extra":1}}'
