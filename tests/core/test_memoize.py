"""MemoizingMiddleware: a session-scoped cache in workflow state (spec §12, scenario 23)."""

from __future__ import annotations

from typing import Any

from tests.conftest import StackFactory
from tooltrail import Host, ToolCall, ToolError, ToolOutput, tool
from tooltrail.core.memoize import MemoCache, MemoizingMiddleware, MemoPlan
from tooltrail.core.results import TextPart

executions: list[str] = []


@tool
def count(path: str = "/a") -> str:
    """Read something (slowly, in real life)."""
    executions.append(f"count {path}")
    return f"{path} has {len(executions)} lines"


@tool
def write(path: str) -> str:
    """Write something."""
    executions.append(f"write {path}")
    return f"wrote {path}"


@tool
def broken() -> str:
    """Always fails."""
    executions.append("broken")
    raise ToolError("nope")


@tool
def picture() -> ToolOutput:
    """Multipart output."""
    executions.append("picture")
    return ToolOutput(parts=[TextPart("a picture")])


def paths(tool_name: str, arguments: dict[str, Any]) -> list[str]:
    return [arguments["path"]] if "path" in arguments else []


def host(ttl: int = 5) -> Host:
    memo = MemoizingMiddleware(
        ["count", "broken", "picture"], write_tools=["write"], path_extractor=paths, ttl_turns=ttl
    )
    return Host([count, write, broken, picture], middleware=[memo])


async def test_a_hit_carries_the_requesting_call_id(stack: StackFactory) -> None:
    executions.clear()
    async with stack(host()) as tt:
        first = await tt.run_turn([ToolCall("call_a", "count", {"path": "/a"})], session_id="m1")
        second = await tt.run_turn([ToolCall("call_b", "count", {"path": "/a"})], session_id="m1")
        events = await tt.audit(second.turn_id)
    assert executions == ["count /a"]
    a, b = first.results[0], second.results[0]
    assert [a.tool_call_id, b.tool_call_id] == ["call_a", "call_b"]
    assert b.output == a.output + "\n[cached]"
    assert b.duration_ms == a.duration_ms
    post = next(e for e in events if e.kind == "tool_post")
    assert post.payload["cached"] is True and post.tool_call_id == "call_b"


async def test_writes_evict_errors_are_never_cached_and_sessions_are_separate(
    stack: StackFactory,
) -> None:
    executions.clear()
    async with stack(host()) as tt:
        await tt.run_turn(
            [
                ToolCall("1", "count", {"path": "/a"}),
                ToolCall("2", "count", {"path": "/b"}),
                ToolCall("3", "write", {"path": "/a"}),
                ToolCall("4", "count", {"path": "/a"}),
                ToolCall("5", "count", {"path": "/b"}),
                ToolCall("6", "broken", {}),
                ToolCall("7", "broken", {}),
            ],
            session_id="m2",
        )
        await tt.run_turn([ToolCall("8", "count", {"path": "/b"})], session_id="other")
    assert executions == [
        "count /a",
        "count /b",
        "write /a",
        "count /a",
        "broken",
        "broken",
        "count /b",
    ]


async def test_entries_expire_after_ttl_turns(stack: StackFactory) -> None:
    executions.clear()
    async with stack(host(ttl=1)) as tt:
        await tt.run_turn([ToolCall("1", "count", {})], session_id="m3")
        await tt.run_turn([ToolCall("2", "count", {})], session_id="m3")
    assert executions == ["count /a", "count /a"]


async def test_multipart_hits_get_a_cached_part(stack: StackFactory) -> None:
    executions.clear()
    async with stack(host()) as tt:
        await tt.run_turn([ToolCall("1", "picture", {})], session_id="m4")
        turn = await tt.run_turn([ToolCall("2", "picture", {})], session_id="m4")
    assert executions == ["picture"]
    assert turn.results[0].output == [TextPart("a picture"), TextPart("[cached]")]


def test_cache_rules() -> None:
    plan = MemoPlan(tools=["r"], write_tools=["w"], ttl_turns=2)
    cache = MemoCache()
    common: dict[str, Any] = {"duration_ms": 1.0, "resolved_tool_name": "r", "display_hint": None}
    cache.remember(plan, tool="r", arguments={"p": 1}, output="x", turn=0, paths=["/p"], **common)
    cache.remember(plan, tool="w", arguments={}, output="w", turn=0, paths=["/p"], **common)
    assert [e.tool for e in cache.entries] == ["r"], "write tools are never cached"
    assert cache.lookup(plan, "r", {"p": 1}, turn=1) is not None
    assert cache.lookup(plan, "r", {"p": 1}, turn=2) is None, "ttl_turns=2: gone in turn 2"
    cache.written(plan, "w", ["/q"])
    assert len(cache.entries) == 1
    cache.written(plan, "w", ["/p"])
    assert cache.entries == []
    disabled = MemoPlan(tools=["r"], ttl_turns=0)
    cache.remember(disabled, tool="r", arguments={}, output="x", turn=0, paths=[], **common)
    assert cache.entries == []
