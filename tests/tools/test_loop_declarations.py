"""Loop detection as the tools declare it (spec §10): thresholds, primary parameter, warning
text, the host's acknowledgement, the breaker's refusals and the end of an agent run."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import StackFactory
from tooltrail import (
    CircuitBreaker,
    Host,
    LoopDetected,
    LoopDetection,
    RunConfig,
    ToolCall,
    ToolDefinitionError,
    ToolError,
    tool,
)
from tooltrail.core.detection import LoopDetector, Operation, primary_value
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response

runs: list[str] = []


@tool(loop_thresholds=2, loop_suggestion="Read another file.")
def read(path: str, encoding: str = "utf-8") -> str:
    """Read a file (always the same text)."""
    runs.append(path)
    return "contents"


@tool(primary_param="path")
def stat(path: str, nonce: int = 0) -> str:
    """Always the same answer, whatever the nonce."""
    runs.append(path)
    return "ok"


@tool
def plain(path: str, nonce: int = 0) -> str:
    """Always the same answer, whatever the arguments."""
    return "ok"


@tool
def down() -> str:
    """Always fails with the same text."""
    raise ToolError("service down")


@pytest.fixture(autouse=True)
def reset() -> None:
    runs.clear()


def test_the_declarations_are_checked_and_reach_the_tool_meta() -> None:
    meta = Host([read, stat, plain]).tool_meta()
    assert (meta["read"].loop_threshold, meta["read"].loop_suggestion) == (2, "Read another file.")
    assert (meta["stat"].primary_param, meta["plain"].primary_param) == ("path", None)
    with pytest.raises(ToolDefinitionError, match="primary_param of tool 'bad'"):
        tool(name="bad", primary_param="nope")(plain.fn)
    for wrong in (0, -1, True, "3"):
        with pytest.raises(ToolDefinitionError, match="loop_thresholds of tool 'bad'"):
            tool(name="bad", loop_thresholds=wrong)(plain.fn)


def test_primary_value_and_repeated() -> None:
    assert primary_value({"path": "/a", "n": 1}, "path") == "/a"
    assert primary_value({"path": ["/a"]}, "path") == '["/a"]'
    assert primary_value({"n": 1}, "path") == primary_value({"n": 1}, None) == ""
    assert primary_value({"path": "a\x00b"}, "path") == '"a\\u0000b"'
    a, b = (
        Operation(tool="t", param="a", result_hash="h"),
        Operation(tool="t", param="b", result_hash="h"),
    )
    detector = LoopDetector(window=[a, b, a, b, a])
    assert detector.repeated() == [a]
    assert detector.repeated("t(b)") == [b]
    assert detector.repeated("t(c)") == [] and LoopDetector().repeated() == []


async def test_a_tools_own_threshold_and_suggestion_reach_the_events(stack: StackFactory) -> None:
    # read's threshold is 2: the third call's pre-check already sees a pattern (the run's
    # threshold, 3, would wait for the fourth).
    calls = [ToolCall(f"c{i}", "read", {"path": "/a"}) for i in range(4)]
    async with stack(Host([read])) as tt:
        turn = await tt.run_turn(calls, session_id="decl-1")
        events = await tt.audit(turn.turn_id)
    detected = [e for e in events if e.kind == "loop_detected"]
    assert [e.tool_call_id for e in detected] == ["c2", "c3"]
    # No primary parameter: the operation's param is the canonical JSON of the model's input.
    assert [e.payload["pattern"] for e in detected] == ['read({"path":"/a"})'] * 2
    assert detected[0].payload["warning"] == (
        """Loop detected: Operation 'read({"path":"/a"})' repeated 2 times with"""
        " same result. Read another file."
    )


async def test_the_primary_param_identifies_the_operation(stack: StackFactory) -> None:
    # Different nonces, one path: with primary_param="path" they are one operation; without
    # it, four different ones.
    config = RunConfig(detection=LoopDetection(loop_threshold=3, stop_threshold=4))
    async with stack(Host([stat, plain])) as tt:
        loose = await tt.run_turn(
            [ToolCall(f"p{i}", "plain", {"path": "/a", "nonce": i}) for i in range(5)],
            session_id="decl-2",
            config=config,
        )
        handle = await tt.start_turn(
            [ToolCall(f"s{i}", "stat", {"path": "/a", "nonce": i}) for i in range(5)],
            session_id="decl-3",
            config=config,
        )
        with pytest.raises(LoopDetected) as raised:
            await handle.result()
        events = await tt.audit(handle.turn_id)
    assert not any(r.is_error for r in loose.results)
    assert raised.value.message == "stat(/a) repeated 4 times"
    stop = [e for e in events if e.kind == "loop_detected" and e.payload["stop"]]
    assert [e.payload["warning"] for e in stop] == [
        "Loop detected: Operation 'stat(/a)' repeated 4 times with same result. STOPPING to"
        " prevent infinite loop. Consider a different approach or tool."
    ]
    assert runs == ["/a"] * 4


async def test_the_warning_is_emitted_when_the_breaker_then_refuses(stack: StackFactory) -> None:
    host = Host([down], circuit_breaker=CircuitBreaker(failure_threshold=3, recovery_s=600))
    async with stack(host) as tt:
        turn = await tt.run_turn(
            [ToolCall(f"c{i}", "down", {}) for i in range(4)], session_id="decl-4"
        )
        events = await tt.audit(turn.turn_id)
    assert turn.results[3].output == "tool temporarily unavailable: circuit breaker open"
    fourth = [e.kind for e in events if e.tool_call_id == "c3"]
    assert fourth == [
        "tool_call_received",
        "tool_pre",
        "loop_detected",
        "breaker_refused",
        "tool_post",
    ]
    warning = next(e for e in events if e.kind == "loop_detected").payload["warning"]
    assert warning == (
        "Loop detected: Operation 'down({})' repeated 3 times with same result."
        " Consider a different approach or tool."
    )


async def test_acknowledging_a_warning_makes_progress_flush_it(
    stack: StackFactory, db_url: str
) -> None:
    # Three identical reads: a warning. The host acknowledges it; the next different result
    # of the same path is progress, so the old repetitions leave the window.
    changing = iter(["one", "one", "one", "two", "two", "two"])

    @tool(name="fetch", primary_param="path")
    def fetch(path: str) -> str:
        return next(changing)

    config = RunConfig(detection=LoopDetection(loop_threshold=3, stop_threshold=5))
    call = lambda i: ToolCall(f"f{i}", "fetch", {"path": "/a"})  # noqa: E731
    async with stack(Host([fetch]), database_url=db_url) as tt:
        await tt.run_turn([call(i) for i in range(3)], session_id="decl-5", config=config)
        assert await tt.acknowledge_loop_warning("decl-5", "nope(/a)") == []
        assert await tt.acknowledge_loop_warning("decl-5") == ["fetch(/a)"]
        assert await tt.acknowledge_loop_warning("unknown-session") == []
        # The acknowledgement is pending until a turn takes it up; the saved state has it.
        state = await tt.store.session_state("decl-5")
        assert [op.pattern for op in state.detector.warned] == ["fetch(/a)"]
        assert state.acks_applied == 1
        turn = await tt.run_turn([call(i) for i in range(3, 6)], session_id="decl-5", config=config)
        after = await tt.store.session_state("decl-5")
    # "two" differs from the warned "one": the three "one"s were flushed, so the window
    # holds the three "two"s only and the acknowledgement is not taken up twice.
    assert not any(r.is_error for r in turn.results)
    assert len(after.detector.window) == 3 and after.acks_applied == 1
    assert {op.result_hash for op in after.detector.window} == {
        after.detector.window[0].result_hash
    }
    assert after.detector.warned == []


async def test_without_the_acknowledgement_nothing_is_flushed(stack: StackFactory) -> None:
    changing = iter(["one", "one", "one", "two"])

    @tool(name="fetch", primary_param="path")
    def fetch(path: str) -> str:
        return next(changing)

    async with stack(Host([fetch])) as tt:
        await tt.run_turn(
            [ToolCall(f"f{i}", "fetch", {"path": "/a"}) for i in range(4)], session_id="decl-6"
        )
        state = await tt.store.session_state("decl-6")
    assert len(state.detector.window) == 4


async def test_an_agent_run_clears_a_stop_level_window_when_it_ends(stack: StackFactory) -> None:
    # loop_threshold 2, stop 3: three identical calls leave the window at stop level. The run
    # ends (the model answers); the session's next run must start clean.
    config = RunConfig(detection=LoopDetection(loop_threshold=2, stop_threshold=3))
    script: list[Any] = [
        tool_call_response(*[(f"c{i}", "stat", {"path": "/a"}) for i in range(3)]),
        text_response("done"),
        tool_call_response(("d0", "stat", {"path": "/a"})),
        text_response("again"),
    ]
    async with stack(Host([stat], model=ScriptedModel(script))) as tt:
        first = await tt.run_agent("go", session_id="decl-7", config=config)
        cleared = await tt.store.session_state("decl-7")
        second = await tt.run_agent("go", session_id="decl-7", config=config)
    assert (first.text, second.text) == ("done", "again")
    assert cleared.detector.window == []
    assert runs == ["/a"] * 4


async def test_an_agent_runs_last_allowed_turn_ends_the_run(stack: StackFactory) -> None:
    config = RunConfig(detection=LoopDetection(loop_threshold=2, stop_threshold=3))
    script: list[Any] = [
        tool_call_response(*[(f"c{i}", "stat", {"path": "/a"}) for i in range(3)]),
        tool_call_response(("d0", "stat", {"path": "/a"})),
        text_response("fine"),
    ]
    async with stack(Host([stat], model=ScriptedModel(script))) as tt:
        first = await tt.run_agent("go", session_id="decl-8", config=config, max_turns=1)
        second = await tt.run_agent("go", session_id="decl-8", config=config)
    assert (first.stopped_by, second.text) == ("max_turns", "fine")
    assert runs == ["/a"] * 4
