"""Session state and turn history stay bounded whatever the calls (issue 22, findings 3, 7, 8).

On a real Temporal server, SQLite and PostgreSQL (``db_url``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import pytest

from tests.conftest import StackFactory
from tooltrail import Host, LoopDetection, RunConfig, ToolCall, tool
from tooltrail.core.detection import LoopDetector, operation_for
from tooltrail.core.memoize import MEMO_CACHE_BYTES, MemoizingMiddleware
from tooltrail.core.text import canonical_json, too_many_calls
from tooltrail.errors import ConfigurationError
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response

FILE_BYTES = 380 * 1024


@tool
def write_file(path: str, content: str) -> str:
    """Write a file (here: say how much)."""
    return f"wrote {len(content)} bytes to {path}"


def test_the_window_holds_bounded_operations_and_the_pattern_logic_is_unchanged() -> None:
    config = LoopDetection(loop_threshold=2, stop_threshold=3)
    detector = LoopDetector()
    big = {"path": "a", "content": "x" * FILE_BYTES}
    other = {"path": "a", "content": "x" * (FILE_BYTES - 1) + "y"}
    for arguments in (big, other, big, big):
        detector.record(operation_for("write_file", arguments, "ok"), config)
    assert len(detector.model_dump_json()) < 4 * 1024
    check = detector.check(config)
    assert check.should_stop and check.repetitions == 3, "identical calls still count as one"
    assert check.message is not None and len(check.message) < 400
    assert check.message.startswith('write_file({"content":"xxxx')
    assert check.message.endswith(" repeated 3 times")
    # A small call keeps the spec's text exactly.
    small = operation_for("write_file", {"path": "p", "content": "c"}, "ok")
    assert small.pattern == "write_file(" + canonical_json({"path": "p", "content": "c"}) + ")"


async def test_a_session_of_huge_calls_is_never_bricked(stack: StackFactory, db_url: str) -> None:
    session = "huge-session"
    model = ScriptedModel(
        [
            tool_call_response(("a1", "write_file", {"path": "z", "content": "z"})),
            text_response("ok"),
        ]
    )
    async with stack(Host([write_file], model=model), database_url=db_url) as tt:
        for turn in range(3):
            content = chr(ord("a") + turn) * FILE_BYTES
            done = await tt.run_turn(
                [ToolCall(f"w{turn}", "write_file", {"path": f"f{turn}", "content": content})],
                session_id=session,
            )
            assert done.results[0].output == f"wrote {FILE_BYTES} bytes to f{turn}"
        small = await tt.run_turn(
            [ToolCall("s", "write_file", {"path": "s", "content": "hi"})], session_id=session
        )
        assert small.results[0].output == "wrote 2 bytes to s"
        agent = await tt.run_agent("write it", session_id=session)
        assert agent.text == "ok"
        state = await tt.store.session_state(session)
    assert len(json.dumps(state.model_dump(mode="json"))) < 16 * 1024
    assert len(state.detector.window) == 5


OUTPUT_BYTES = 240 * 1024


@tool(concurrent_safe=True)
def chunk(n: int) -> str:
    """Return 240 KB of text (each under the large-output threshold)."""
    return str(n) * OUTPUT_BYTES


@pytest.mark.parametrize("dispatch", ["sequential", "parallel"])
async def test_nine_outputs_of_240_kb_complete(
    stack: StackFactory, db_url: str, dispatch: Literal["sequential", "parallel"]
) -> None:
    calls = [ToolCall(f"c{n}", "chunk", {"n": n}) for n in range(9)]
    async with stack(Host([chunk]), database_url=db_url) as tt:
        turn = await asyncio.wait_for(
            tt.run_turn(calls, session_id=f"nine-{dispatch}", config=RunConfig(dispatch=dispatch)),
            timeout=60,
        )
        record = await tt.store.turn(turn.turn_id)
        events = await tt.audit(turn.turn_id)
        history = await tt.client.get_workflow_handle(turn.turn_id).fetch_history()
    assert [r.output for r in turn.results] == [str(n) * OUTPUT_BYTES for n in range(9)]
    assert record is not None and record.status == "completed"
    posts = [e for e in events if e.kind == "tool_post"]
    outputs = {p.tool_call_id: p.payload["output"] for p in posts}
    assert outputs == {f"c{n}": str(n) * OUTPUT_BYTES for n in range(9)}
    assert sum(1 for p in posts if p.payload.get("output_ref")) >= 7, "past the budget: spilled"
    largest = max(len(e.SerializeToString()) for e in history.events)
    assert largest < RunConfig().inline_output_bytes * 2 + 64 * 1024


@tool
def count_me(n: int) -> str:
    """Count a call."""
    counted.append(n)
    return str(n)


counted: list[int] = []


async def test_too_many_calls_are_refused_before_anything_runs(
    stack: StackFactory, db_url: str
) -> None:
    counted.clear()
    config = RunConfig(max_calls=3)
    async with stack(Host([count_me]), database_url=db_url) as tt:
        with pytest.raises(ConfigurationError) as raised:
            await tt.start_turn(
                [ToolCall(f"c{n}", "count_me", {"n": n}) for n in range(4)],
                session_id="many",
                config=config,
            )
        assert str(raised.value) == too_many_calls(4, 3)
        assert await tt.store.turns(session_id="many") == []
        turn = await tt.run_turn(
            [ToolCall(f"c{n}", "count_me", {"n": n}) for n in range(3)],
            session_id="many",
            config=config,
        )
    assert [r.output for r in turn.results] == ["0", "1", "2"]
    assert counted == [0, 1, 2]


async def test_an_agent_turn_with_too_many_calls_runs_none(
    stack: StackFactory, db_url: str
) -> None:
    counted.clear()
    model = ScriptedModel(
        [
            tool_call_response(*[(f"c{n}", "count_me", {"n": n}) for n in range(4)]),
            text_response("split it"),
        ]
    )
    async with stack(Host([count_me], model=model), database_url=db_url) as tt:
        result = await tt.run_agent("count", session_id="many-agent", config=RunConfig(max_calls=3))
    assert result.text == "split it"
    assert counted == []
    answers = [m for m in model.requests[1].messages if m.role == "tool"]
    assert [m.content for m in answers] == [too_many_calls(4, 3)] * 4


@tool
def fetch(page: int) -> str:
    """Return 100 KB of a page (memoized)."""
    fetched.append(page)
    return str(page % 10) * 100_000


fetched: list[int] = []


async def test_the_memo_cache_keeps_the_session_small(stack: StackFactory, db_url: str) -> None:
    fetched.clear()
    host = Host([fetch], middleware=[MemoizingMiddleware(["fetch"], ttl_turns=100)])
    async with stack(host, database_url=db_url) as tt:
        for page in range(6):
            await tt.run_turn([ToolCall(f"p{page}", "fetch", {"page": page})], session_id="memo")
        again = await tt.run_turn(
            [ToolCall("new", "fetch", {"page": 5}), ToolCall("old", "fetch", {"page": 0})],
            session_id="memo",
        )
        state = await tt.store.session_state("memo")
    assert len(json.dumps(state.model_dump(mode="json"))) <= MEMO_CACHE_BYTES + 16 * 1024
    assert again.results[0].output.endswith("[cached]"), "the newest entries stay"
    assert not again.results[1].output.endswith("[cached]"), "the oldest went first"
    assert fetched == [0, 1, 2, 3, 4, 5, 0]
