"""TurnWorkflow on a real Temporal dev server: the sequential pipeline, rule by rule."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.conftest import StackFactory
from tooltrail import (
    Host,
    ImagePart,
    RunConfig,
    TextPart,
    ToolCall,
    ToolContext,
    ToolError,
    ToolOutput,
    Tooltrail,
    tool,
)
from tooltrail.core.text import QUOTE_CHARS, not_available
from tooltrail.core.wire import TOOL_EXECUTE

calls: Counter[str] = Counter()


@tool
async def echo(text: str) -> str:
    """Return the text."""
    calls["echo"] += 1
    return text


@tool
async def fails() -> str:
    """Raise a ToolError."""
    calls["fails"] += 1
    raise ToolError("boom")


@tool
def p() -> str:
    """Panic."""
    calls["p"] += 1
    raise RuntimeError("x")


@tool
def silent_panic() -> str:
    """Panic without a message."""
    raise RuntimeError()


async def activity_count(tt: Tooltrail, turn_id: str) -> int:
    history = await tt.client.get_workflow_handle(turn_id).fetch_history()
    return sum(
        1
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.activity_task_scheduled_event_attributes.activity_type.name == TOOL_EXECUTE
    )


async def kinds(tt: Tooltrail, turn_id: str) -> list[tuple[str, str | None]]:
    return [(event.kind, event.tool_call_id) for event in await tt.audit(turn_id)]


async def test_normal_tool_works_and_pre_post_pair(stack: StackFactory) -> None:
    async with stack(Host([echo])) as tt:
        turn = await tt.run_turn([ToolCall("call_1", "echo", {"text": "ok"})], session_id="s")
        trail = await kinds(tt, turn.turn_id)
    result = turn.results[0]
    assert (result.is_error, result.output, result.tool_call_id, result.resolved_tool_name) == (
        False,
        "ok",
        "call_1",
        "echo",
    )
    assert result.duration_ms >= 0
    assert trail == [
        ("turn_started", None),
        ("tool_call_received", "call_1"),
        ("tool_pre", "call_1"),
        ("tool_post", "call_1"),
        ("turn_end", None),
    ]


async def test_tool_error_is_soft_verbatim_and_runs_once(stack: StackFactory) -> None:
    before = calls["fails"]
    async with stack(Host([fails])) as tt:
        turn = await tt.run_turn([ToolCall("c", "fails", {})], session_id="s")
        assert await activity_count(tt, turn.turn_id) == 1
    assert turn.results[0].is_error and turn.results[0].output == "boom"
    assert calls["fails"] - before == 1


async def test_panic_is_isolated_with_exact_text_and_no_temporal_retry(
    stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    before = calls["p"]
    async with stack(Host([p, silent_panic])) as tt:
        turn = await tt.run_turn(
            [ToolCall("c1", "p", {}), ToolCall("c2", "silent_panic", {})], session_id="s"
        )
        history = await tt.client.get_workflow_handle(turn.turn_id).fetch_history()
    assert [r.output for r in turn.results] == [
        "tool 'p' panicked: x",
        "tool 'silent_panic' panicked (unknown payload)",
    ]
    assert all(r.is_error for r in turn.results)
    assert calls["p"] - before == 1
    completed = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    assert completed and set(completed) == {1}, "a panicking tool never causes a Temporal retry"
    assert not any(
        e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED for e in history.events
    )
    assert any("tool 'p' panicked" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_never_advertised_tool_is_pre_answered_without_dispatch(
    stack: StackFactory,
) -> None:
    async with stack(Host([echo])) as tt:
        turn = await tt.run_turn(
            [ToolCall("g", "ghost", {"a": 1}), ToolCall("e", "echo", {"text": "hi"})],
            session_id="s",
        )
        assert await activity_count(tt, turn.turn_id) == 1
        events = await tt.audit(turn.turn_id)
    ghost = turn.results[0]
    assert (ghost.output, ghost.is_error, ghost.duration_ms, ghost.resolved_tool_name) == (
        "tool 'ghost' is not available",
        True,
        0.0,
        "ghost",
    )
    assert [r.tool_call_id for r in turn.results] == ["g", "e"]
    ghost_events = [e.kind for e in events if e.tool_call_id == "g"]
    assert ghost_events == ["tool_call_received"]
    assert events[1].payload["input"] == {"a": 1}


HUGE_NAME_CHARS = 20_000


async def test_answers_to_huge_never_advertised_names_are_cut_and_budgeted(
    stack: StackFactory,
) -> None:
    # 60 calls to never-advertised tools with 20,000-character names: answers quoting each
    # name whole (and naming it as the resolved tool) would put 2.4 MB in the turn's result,
    # past Temporal's payload limit. Each answer quotes at most QUOTE_CHARS of the name, and
    # the answers spend the turn's inline budget: once it is gone they leave the name out.
    calls = [ToolCall(f"g{i}", f"{i:03d}" + "n" * HUGE_NAME_CHARS, {}) for i in range(60)]
    limit = QUOTE_CHARS + 100
    async with stack(Host([echo])) as tt:
        roomy = await tt.run_turn([*calls, ToolCall("e", "echo", {"text": "hi"})], session_id="s")
        tight = await tt.run_turn(
            calls, session_id="s2", config=RunConfig(inline_output_bytes=1000)
        )
    assert [r.tool_call_id for r in roomy.results] == [*(c.id for c in calls), "e"]
    assert roomy.results[-1].output == "hi"
    for call, result in zip(calls, roomy.results[:-1], strict=True):
        assert result.is_error and isinstance(result.output, str)
        assert result.output == not_available(call.name)
        assert result.output.startswith(f"tool '{call.name[:QUOTE_CHARS]}...")
        assert f"({len(call.name)} characters)" in result.output
        assert len(result.output) < limit and len(result.resolved_tool_name) < limit
    outputs = [r.output for r in tight.results]
    assert all(isinstance(o, str) and f"({HUGE_NAME_CHARS + 3} characters)" in o for o in outputs)
    quoting = [o for o in outputs if isinstance(o, str) and "nnnn" in o]
    # The first answers fit the 1,000 bytes with the name's head; the rest say only its size.
    assert 1 <= len(quoting) <= 1000 // QUOTE_CHARS and outputs[: len(quoting)] == quoting
    assert all(len(o) < 60 for o in outputs[len(quoting) :])


async def test_case_sensitive_advertised_names(stack: StackFactory) -> None:
    async with stack(Host([echo])) as tt:
        turn = await tt.run_turn([ToolCall("c", "Echo", {"text": "x"})], session_id="s")
    assert turn.results[0].output == "tool 'Echo' is not available"


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["b", "a"], "Tool not found: x. Available: a, b"),
        ([], "Tool not found: x. Available: none registered"),
        (
            [f"t{i:02d}" for i in range(1, 14)],
            "Tool not found: x. Available: t01, t02, t03, t04, t05, t06, t07, t08, t09, "
            "t10... (and 3 more)",
        ),
    ],
)
async def test_advertised_but_missing_at_dispatch(
    stack: StackFactory, names: list[str], expected: str
) -> None:
    def make(name: str) -> Any:
        def body() -> str:
            return name

        return tool(name=name)(body)

    host = Host([make(name) for name in names])
    async with stack(host) as tt:
        turn = await tt.run_turn([ToolCall("c", "x", {})], session_id="s", advertised=[*names, "x"])
        events = await tt.audit(turn.turn_id)
    result = turn.results[0]
    assert (result.output, result.is_error, result.duration_ms, result.resolved_tool_name) == (
        expected,
        True,
        0.0,
        "x",
    )
    # A miss at the core is an ordinary result: PRE, POST and recovery apply.
    assert [e.kind for e in events if e.tool_call_id == "c"] == [
        "tool_call_received",
        "tool_pre",
        "tool_post",
        "recovery_decision",
    ]


async def test_raw_json_arguments(stack: StackFactory) -> None:
    before = calls["echo"]
    async with stack(Host([echo])) as tt:
        turn = await tt.run_turn(
            [
                ToolCall("ok", "echo", '{"text": "raw"}'),
                ToolCall("bad", "echo", '{"text": '),
                ToolCall("list", "echo", "[1, 2]"),
            ],
            session_id="s",
        )
        assert await activity_count(tt, turn.turn_id) == 1
    ok, bad, lst = turn.results
    assert ok.output == "raw" and not ok.is_error
    assert bad.is_error and bad.output.startswith("invalid arguments: not valid JSON")
    assert lst.is_error and lst.output == "invalid arguments: expected a JSON object, got list"
    assert calls["echo"] - before == 1


async def test_arguments_are_validated_by_the_schema(stack: StackFactory) -> None:
    @tool
    def add(a: int, b: int = 2) -> int:
        return a + b

    async with stack(Host([add])) as tt:
        turn = await tt.run_turn(
            [
                ToolCall("ok", "add", {"a": "40"}),
                ToolCall("bad", "add", {"a": "x", "b": "y"}),
                ToolCall("missing", "add", {}),
            ],
            session_id="s",
        )
    ok, bad, missing = turn.results
    assert (ok.output, ok.is_error) == ("42", False)
    assert bad.output == "guardrail violation: a: not a valid integer; b: not a valid integer"
    assert missing.output == "guardrail violation: a: field required"
    assert bad.duration_ms == 0.0


class Point(BaseModel):
    x: int
    y: int


async def test_return_values_and_tool_output(stack: StackFactory) -> None:
    @tool
    def model() -> Point:
        return Point(x=1, y=2)

    @tool
    def data() -> dict[str, Any]:
        return {"b": [1, 2], "a": "é"}

    @tool
    def multipart() -> ToolOutput:
        return ToolOutput(
            parts=[TextPart("see"), ImagePart("image/png", "aGk=")], display_hint="image"
        )

    @tool
    def soft() -> ToolOutput:
        return ToolOutput(text="not today", is_error=True)

    @tool
    def unserialisable() -> object:
        return object()

    async with stack(Host([model, data, multipart, soft, unserialisable])) as tt:
        turn = await tt.run_turn(
            [ToolCall(n, n, {}) for n in ("model", "data", "multipart", "soft", "unserialisable")],
            session_id="s",
        )
        events = await tt.audit(turn.turn_id)
    m, d, mp, s, u = turn.results
    assert m.output == '{"x":1,"y":2}'
    assert d.output == '{"b":[1,2],"a":"é"}'
    assert mp.output == [TextPart("see"), ImagePart("image/png", "aGk=")]
    assert mp.display_hint == "image" and not mp.is_error
    assert (s.output, s.is_error) == ("not today", True)
    assert u.is_error and u.output.startswith("tool 'unserialisable' panicked: returned a value")
    post = next(e for e in events if e.kind == "tool_post" and e.tool_call_id == "multipart")
    assert post.payload["output"][1] == {
        "kind": "image",
        "media_type": "image/png",
        "data_b64": "aGk=",
    }


async def test_context_and_scratch_directory(stack: StackFactory, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    @tool
    def inspect_ctx(ctx: ToolContext) -> str:
        seen["ctx"] = ctx
        seen["exists"] = ctx.temp_dir.is_dir()
        seen["mode"] = ctx.temp_dir.stat().st_mode & 0o777
        seen["thread"] = threading.current_thread() is not threading.main_thread()
        (ctx.temp_dir / "note.txt").write_text("scratch")
        return "ok"

    host = Host([inspect_ctx], scratch_base=tmp_path / "scratch-base")
    async with stack(host) as tt:
        turn = await tt.run_turn([ToolCall("c9", "inspect_ctx", {})], session_id="sess-1")
        ctx = seen["ctx"]
        assert ctx.temp_dir.name.startswith("tooltrail-sess-1-")
        assert ctx.temp_dir.parent == tmp_path / "scratch-base"
        assert seen["exists"] and seen["thread"], "sync tools run in a worker thread"
        assert seen["mode"] == 0o700, "private to the worker's user"
        assert (ctx.session_id, ctx.turn_id, ctx.tool_call_id, ctx.attempt) == (
            "sess-1",
            turn.turn_id,
            "c9",
            0,
        )
        assert ctx.idempotency_key is None and ctx.principal is None
        assert await tt.close_session("sess-1") is True
        assert not ctx.temp_dir.exists()
        assert await tt.close_session("sess-1") is False, "a missing directory is silent"


async def test_hostile_session_id_stays_inside_the_scratch_base(
    stack: StackFactory, tmp_path: Path
) -> None:
    seen: dict[str, Path] = {}

    @tool
    def where(ctx: ToolContext) -> str:
        seen["dir"] = ctx.temp_dir
        return "ok"

    async with stack(Host([where], scratch_base=tmp_path / "base")) as tt:
        await tt.run_turn([ToolCall("c", "where", {})], session_id="../../etc")
    assert seen["dir"].parent == tmp_path / "base"
    assert seen["dir"].name.startswith("tooltrail-.._.._etc-")


async def test_received_events_first_and_results_in_model_order(stack: StackFactory) -> None:
    async with stack(Host([echo, fails])) as tt:
        batch = [
            ToolCall("c1", "echo", {"text": "1"}),
            ToolCall("c2", "nope", {}),
            ToolCall("c3", "fails", {}),
            ToolCall("c4", "echo", '{"text": "4"}'),
        ]
        turn = await tt.run_turn(batch, session_id="s")
        events = await tt.audit(turn.turn_id)
    assert [r.tool_call_id for r in turn.results] == ["c1", "c2", "c3", "c4"]
    assert [e.seq for e in events] == list(range(len(events)))
    received = [e for e in events if e.kind == "tool_call_received"]
    assert [e.tool_call_id for e in received] == ["c1", "c2", "c3", "c4"]
    assert [e.payload["input"] for e in received] == [
        {"text": "1"},
        {},
        {},
        '{"text": "4"}',
    ]
    first_pre = next(i for i, e in enumerate(events) if e.kind == "tool_pre")
    assert all(e.seq < events[first_pre].seq for e in received)
    assert events[-1].kind == "turn_end"
    assert events[-1].payload["phase"] == "tools" and events[-1].payload["success"] is True
    assert [r["tool_call_id"] for r in events[-1].payload["results"]] == ["c1", "c2", "c3", "c4"]
    pre = next(e for e in events if e.kind == "tool_pre")
    assert pre.payload == {"turn": turn.turn_id, "tool": "echo", "tool_call_id": "c1"}
    assert pre.attempt == 0


async def test_memory_trajectory_for_successes_only(stack: StackFactory) -> None:
    @tool
    def big(text: str) -> str:
        return text * 2

    long_text = "é" * 600
    async with stack(Host([big, fails])) as tt:
        turn = await tt.run_turn(
            [ToolCall("a", "big", {"text": long_text}), ToolCall("b", "fails", {})],
            session_id="mem-1",
        )
        memory = await tt.memory("mem-1")
        events = await tt.audit(turn.turn_id)
    assert len(memory) == 1
    entry = memory[0]
    input_json = '{"text":"' + long_text + '"}'
    assert entry.kind == "trajectory" and entry.tool_call_id == "a"
    assert entry.content == (
        f"tool=big; input={input_json[:500]}\u2026; result={('é' * 500)}\u2026"
    )
    post = next(e for e in events if e.kind == "tool_post" and e.tool_call_id == "a")
    assert post.payload["output"] == long_text * 2, "the audit trail is never truncated"
    assert post.payload["input"] == {"text": long_text}


async def test_turn_ids_are_never_reused(stack: StackFactory) -> None:
    from tooltrail import ConfigurationError

    async with stack(Host([echo])) as tt:
        await tt.run_turn([ToolCall("c", "echo", {"text": "x"})], session_id="s", turn_id="t-1")
        with pytest.raises(ConfigurationError, match="'t-1' was already used"):
            await tt.run_turn([ToolCall("c", "echo", {"text": "x"})], session_id="s", turn_id="t-1")


async def test_audit_trail_on_both_databases(stack: StackFactory, db_url: str) -> None:
    async with stack(Host([echo, fails]), database_url=db_url) as tt:
        turn = await tt.run_turn(
            [ToolCall("c1", "echo", {"text": "x" * 5000}), ToolCall("c2", "fails", {})],
            session_id="db-s",
        )
        events = await tt.audit(turn.turn_id)
        row = await tt.store.turn(turn.turn_id)
        listed = await tt.turns(session_id="db-s")
        errors = await tt.turns(session_id="db-s", errors_only=True)
    assert [e.kind for e in events] == [
        "turn_started",
        "tool_call_received",
        "tool_call_received",
        "tool_pre",
        "tool_post",
        "tool_pre",
        "tool_post",
        "recovery_decision",
        "turn_end",
    ]
    assert events[4].payload["output"] == "x" * 5000
    assert events[6].payload["is_error"] is True
    assert all(e.created_at.tzinfo is not None for e in events)
    assert row is not None and row.status == "completed" and row.call_count == 2
    assert row.ended_at is not None and row.ended_at >= row.started_at
    assert [t.turn_id for t in listed] == [turn.turn_id]
    assert listed[0].error_results == 1 and listed[0].event_count == 9
    assert [t.turn_id for t in errors] == [turn.turn_id]


async def test_duplicate_call_ids_run_once(stack: StackFactory) -> None:
    before = calls["echo"]
    async with stack(Host([echo])) as tt:
        turn = await tt.run_turn(
            [
                ToolCall("same", "echo", {"text": "first"}),
                ToolCall("same", "echo", {"text": "second"}),
                ToolCall("other", "echo", {"text": "third"}),
            ],
            session_id="s",
        )
    assert [(r.tool_call_id, r.output, r.is_error) for r in turn.results] == [
        ("same", "first", False),
        ("same", "duplicate tool_call_id 'same': only the first call with this id runs", True),
        ("other", "third", False),
    ]
    assert calls["echo"] - before == 2


async def test_a_turn_starts_eagerly_on_a_worker_of_its_own_client(stack: StackFactory) -> None:
    # The client asks for an eager start: when a worker of the turn's queue runs on the same
    # client (tooltrail.local), the server hands it the first workflow task with its answer
    # to the start; a client without one (a separate process) gets a plain start.
    host = Host([echo])
    async with stack(host) as tt:
        eager = await tt.run_turn([ToolCall("c1", "echo", {"text": "a"})], session_id="eager")
        config = tt.client.config()
        other = await Client.connect(
            tt.client.service_client.config.target_host,
            namespace=tt.client.namespace,
            data_converter=config["data_converter"],
        )
        remote = Tooltrail(other, host, task_queue=tt.task_queue, store=tt.store)
        plain = await remote.run_turn([ToolCall("c1", "echo", {"text": "b"})], session_id="eager")
        accepted = [
            (await tt.client.get_workflow_handle(turn.turn_id).fetch_history())
            .events[0]
            .workflow_execution_started_event_attributes.eager_execution_accepted
            for turn in (eager, plain)
        ]
    assert [eager.results[0].output, plain.results[0].output] == ["a", "b"]
    assert accepted == [True, False]
