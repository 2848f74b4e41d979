"""The durable agent loop: model phase, AgentRunWorkflow, against a local HTTP model server."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tests.faults.history import intervals, max_overlap
from tests.support.llm_server import LLMServer, anthropic_message, openai_completion
from tests.support.stand_ins import BrokenScratch, SlowModel
from tooltrail import (
    Host,
    LoopDetected,
    LoopDetection,
    RunConfig,
    ToolError,
    Tooltrail,
    TurnCancelled,
    TurnFailed,
    tool,
)
from tooltrail.core.messages import Thinking, Usage
from tooltrail.core.wire import ModelSettings, TurnRecord
from tooltrail.db.store import AuditStore
from tooltrail.llm.anthropic import AnthropicMessagesClient
from tooltrail.llm.openai import OpenAIChatClient
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response
from tooltrail.runtime.worker import build_worker


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
async def slow() -> str:
    """Take a long time."""
    await asyncio.sleep(30)
    return "late"


async def test_a_multi_turn_run_over_http(stack: StackFactory) -> None:
    with LLMServer() as server:
        server.reply(
            body=openai_completion(
                tool_calls=[("c1", "add", '{"a": 2, "b": 3}'), ("c2", "add", "{bad json")]
            )
        )
        server.reply(body=openai_completion("The sum is 5."))
        client = OpenAIChatClient(server.url, api_key="test-key", model="test-model")
        async with stack(Host([add], model=client)) as tt:
            handle = await tt.start_agent(
                "What is 2 + 3?", session_id="agent-1", system="Be brief."
            )
            result = await handle.result()
            conversation = await tt.conversation(result.run_id)
            first_turn = await tt.audit(result.turns[0])
            progress = await handle.progress()
    assert (result.text, result.stopped_by, len(result.turns)) == ("The sum is 5.", "answer", 2)
    assert result.stop_reason == "end_turn"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (22, 14)
    assert progress.status == "done" and progress.turns == result.turns
    assert [m.role for m in conversation] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    tool_messages = [m for m in conversation if m.role == "tool"]
    assert tool_messages[0].content == "5" and not tool_messages[0].is_error
    assert tool_messages[1].is_error and tool_messages[1].content.startswith("invalid arguments")
    second_request = server.requests[1].body
    assert [m["role"] for m in second_request["messages"]][-2:] == ["tool", "tool"]
    assert second_request["tools"][0]["function"]["name"] == "add"
    ends = [e.payload for e in first_turn if e.kind == "turn_end"]
    assert [e["phase"] for e in ends] == ["llm", "tools"]
    assert all((e["input_tokens"], e["output_tokens"]) == (11, 7) for e in ends)
    assert [e.kind for e in first_turn][:2] == ["turn_started", "model_response"]


async def test_rate_limits_are_retried_after_the_servers_delay(stack: StackFactory) -> None:
    with LLMServer() as server:
        server.reply(429, {"error": {"message": "slow down"}}, retry_after="1")
        server.reply(body=openai_completion("done"))
        client = OpenAIChatClient(server.url, api_key="k", model="m")
        async with stack(Host([add], model=client)) as tt:
            result = await tt.run_agent("hi", session_id="agent-2")
    assert result.text == "done"
    assert len(server.requests) == 2


@pytest.mark.parametrize("local_model", [False, True])
async def test_a_rejected_request_is_not_retried(stack: StackFactory, local_model: bool) -> None:
    with LLMServer() as server:
        server.reply(400, {"error": {"message": "bad request: unknown parameter"}})
        client = OpenAIChatClient(server.url, api_key="k", model="m")
        run_id = f"run-agent-3-{local_model}"
        async with stack(Host([add], model=client)) as tt:
            with pytest.raises(TurnFailed, match="model call failed") as failed:
                await tt.run_agent("hi", session_id=run_id, run_id=run_id, local_model=local_model)
            events = await tt.audit(f"{run_id}-turn-0")
    assert len(server.requests) == 1
    assert failed.value.turn_id == run_id
    # The turn never read the session's state, yet its trail opens as every trail does.
    assert [e.kind for e in events] == ["turn_started", "turn_end"]
    assert events[-1].payload["error"].startswith("model call failed")


async def test_a_local_model_call_runs_in_the_turns_workflow_task(stack: StackFactory) -> None:
    # local_model=True: the same run, the same trail and conversation, with the model asked
    # in a local activity (a marker in the turn's history, no activity of its own).
    with LLMServer() as server:
        for _ in range(2):
            # Longer than the retry policy's first interval (1 s): the server's word counts.
            server.reply(429, {"error": {"message": "slow down"}}, retry_after="2")
            server.reply(body=openai_completion(tool_calls=[("c1", "add", '{"a": 2, "b": 3}')]))
            server.reply(body=openai_completion("The sum is 5."))
        client = OpenAIChatClient(server.url, api_key="k", model="m")
        async with stack(Host([add], model=client)) as tt:
            runs = {
                local: await tt.run_agent(
                    "What is 2 + 3?",
                    session_id=f"agent-local-{local}",
                    local_model=local,
                    # The rate limit's wait would let a time-based audit batch go before the
                    # tool call in one run and not the other: only the turns' ends write.
                    config=RunConfig(audit_interval_s=60),
                )
                for local in (False, True)
            }
            trails = {
                local: [[e.kind for e in await tt.audit(t)] for t in run.turns]
                for local, run in runs.items()
            }
            conversations = {
                local: [(m.role, m.content) for m in await tt.conversation(run.run_id)]
                for local, run in runs.items()
            }
            histories = {
                local: [await tt.client.get_workflow_handle(t).fetch_history() for t in run.turns]
                for local, run in runs.items()
            }
    assert [run.text for run in runs.values()] == ["The sum is 5."] * 2
    assert len(server.requests) == 6  # the rate-limited request was retried in both runs
    waits = [server.requests[i + 1].received_at - server.requests[i].received_at for i in (0, 3)]
    assert all(wait >= 1.9 for wait in waits), waits
    assert trails[True] == trails[False]
    assert conversations[True] == conversations[False]

    def model_activities(history: WorkflowHistory) -> int:
        return sum(
            e.activity_task_scheduled_event_attributes.activity_type.name == "tooltrail.model.turn"
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        )

    def markers(history: WorkflowHistory) -> int:
        return sum(e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED for e in history.events)

    assert [model_activities(h) for h in histories[False]] == [1, 1]
    assert [model_activities(h) for h in histories[True]] == [0, 0]
    # The model's answer is recorded all the same: one more marker per turn, one workflow
    # task fewer (the call ran inside the turn's first one).
    assert [markers(h) for h in histories[True]] == [markers(h) + 1 for h in histories[False]]
    tasks = [
        [
            sum(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for e in h.events)
            for h in histories[local]
        ]
        for local in (False, True)
    ]
    assert tasks[1] == [n - 1 for n in tasks[0]]


async def test_long_runs_continue_as_new_and_keep_history_small(stack: StackFactory) -> None:
    script: list[Any] = [tool_call_response((f"c{i}", "add", {"a": i, "b": 1})) for i in range(5)]
    script.append(text_response("finished"))
    async with stack(Host([add], model=ScriptedModel(script))) as tt:
        handle = await tt.start_agent(
            "count", session_id="agent-4", max_turns=10, turns_per_segment=2
        )
        result = await handle.result()
        history = await tt.client.get_workflow_handle(result.run_id).fetch_history()
        conversation = await tt.conversation(result.run_id)
    assert (result.text, len(result.turns)) == ("finished", 6)
    assert result.turns == [f"{result.run_id}-turn-{i}" for i in range(6)]
    assert len(conversation) == 1 + 6 + 5
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.continued_execution_run_id, "the last segment continued from an earlier run"
    # The segment's history carries references and new messages, never the transcript: the
    # opening prompt is in SQL, not in this segment's input.
    assert "count" not in history.to_json()
    assert json.loads(conversation[0].model_dump_json())["content"] == "count"


async def test_cancelling_a_run_cancels_the_turn_in_flight(stack: StackFactory) -> None:
    script = [tool_call_response(("c1", "slow", {}))]
    async with stack(Host([slow], model=ScriptedModel(script))) as tt:
        handle = await tt.start_agent("wait", session_id="agent-5")
        for _ in range(400):
            progress = await handle.progress()
            if progress.status == "model" and progress.turn_index == 0:
                await asyncio.sleep(0.05)
                history = await tt.client.get_workflow_handle(handle.run_id).fetch_history()
                if any(
                    e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED
                    for e in history.events
                ):
                    break
        await asyncio.sleep(0.5)
        await handle.cancel()
        with pytest.raises(TurnCancelled):
            await handle.result()
        turn = await _ended(tt, f"{handle.run_id}-turn-0")
    assert turn is not None and turn.status == "cancelled"


@tool(concurrent_safe=True)
async def pause(ms: int) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(ms / 1000)
    return f"paused {ms}"


@tool
async def pause_alone(ms: int) -> str:
    """Sleep, then answer (never concurrently)."""
    await asyncio.sleep(ms / 1000)
    return f"paused {ms}"


@pytest.mark.parametrize(("name", "expected"), [("pause", 3), ("pause_alone", 1)])
async def test_agent_turns_dispatch_in_parallel_by_the_tools_declarations(
    stack: StackFactory, name: str, expected: int
) -> None:
    # The model's calls are known only in the turn: the worker judges them for the waves.
    script: list[Any] = [
        tool_call_response(*[(f"c{i}", name, {"ms": 300 + i}) for i in range(3)]),
        text_response("rested"),
    ]
    config = RunConfig(dispatch="parallel")
    async with stack(Host([pause, pause_alone], model=ScriptedModel(script))) as tt:
        result = await tt.run_agent("rest", session_id=f"agent-par-{name}", config=config)
        events = await tt.audit(result.turns[0])
    assert result.text == "rested"
    assert max_overlap(list(intervals(events).values())) == expected


async def test_the_worker_gives_the_model_its_catalog_and_no_turn_history_holds_it(
    stack: StackFactory,
) -> None:
    seen: list[list[str]] = []

    def step(request: Any) -> Any:
        seen.append([spec["function"]["name"] for spec in request.tools])
        if len(seen) == 1:
            return tool_call_response(("c1", "add", {"a": 1, "b": 2}))
        return text_response("3")

    async with stack(Host([add, pause], model=ScriptedModel([step, step]))) as tt:
        result = await tt.run_agent("add", session_id="agent-catalog")
        inputs = [
            (await tt.client.get_workflow_handle(workflow_id).fetch_history())
            .events[0]
            .workflow_execution_started_event_attributes.input.payloads[0]
            .data
            for workflow_id in [result.run_id, *result.turns]
        ]
    assert result.text == "3"
    assert seen == [["add", "pause"], ["add", "pause"]]
    # The schemas (with their descriptions) are built by the worker, not carried per turn.
    assert inputs and all(b"Sleep, then answer." not in data for data in inputs)
    assert all(b'"catalog"' not in data and b'"parameters"' not in data for data in inputs)


def raw(history: WorkflowHistory) -> bytes:
    """A history's events as Temporal stores them."""
    return b"".join(event.SerializeToString() for event in history.events)


@tool
def report(part: int) -> str:
    """Return a long report."""
    return f"REPORT-{part}-" + "x" * 2000


async def test_a_runs_history_passes_no_tool_output_or_loop_window_between_turns(
    stack: StackFactory,
) -> None:
    # Each turn reads the session's state with the conversation and appends its own tool
    # results, so neither travels through the run: a model turn costs the same at any length.
    script: list[Any] = [tool_call_response((f"c{i}", "report", {"part": i})) for i in range(6)]
    script.append(text_response("read them all"))
    async with stack(Host([report], model=ScriptedModel(script))) as tt:
        result = await tt.run_agent("read", session_id="agent-flat", max_turns=10)
        run_history = await tt.client.get_workflow_handle(result.run_id).fetch_history()
        turns = [
            await tt.client.get_workflow_handle(turn_id).fetch_history() for turn_id in result.turns
        ]
        conversation = await tt.conversation(result.run_id)
        state = await tt.store.session_state("agent-flat")
        first = await tt.get_turn(result.turns[0]).result()
    assert result.text == "read them all"
    assert b"REPORT-" not in raw(run_history)
    # Each output is in its own turn's history once (the tool activity's result), in no other.
    for i, history in enumerate(turns[:-1]):
        data = raw(history)
        assert data.count(f"REPORT-{i}-".encode()) == 1
        assert b"REPORT-" not in data.replace(f"REPORT-{i}-".encode(), b"")
    # The loop detector's window is in each later turn's history once (the model call read
    # it), not in its input and output, nor in the run's history.
    first_call = b'{\\"part\\":0}'  # the window's entry of c0, as text inside JSON
    assert [raw(h).count(first_call) for h in turns[1:]] == [1] * 6
    assert first_call not in raw(run_history)
    # What the turns stored: the results in the conversation, the window in the session.
    tool_messages = [m.content for m in conversation if m.role == "tool"]
    assert [t[: len("REPORT-0-")] for t in tool_messages] == [f"REPORT-{i}-" for i in range(6)]
    assert [m.role for m in conversation][:4] == ["user", "assistant", "tool", "assistant"]
    assert len(state.detector.window) == 6 and state.version == 7
    # A turn's handle still gives its results, from the audit trail.
    assert [(r.tool_call_id, r.output[:9]) for r in first.results] == [("c0", "REPORT-0-")]


async def test_loop_detection_spans_the_turns_of_an_agent_run(stack: StackFactory) -> None:
    # One identical call per model turn: only the state read turn after turn can see the loop.
    script: list[Any] = [tool_call_response((f"c{i}", "add", {"a": 1, "b": 1})) for i in range(5)]
    config = RunConfig(detection=LoopDetection(loop_threshold=2, stop_threshold=3))
    async with stack(Host([add], model=ScriptedModel(script))) as tt:
        with pytest.raises(LoopDetected, match=r"add\(.*\) repeated 3 times"):
            await tt.run_agent("loop", session_id="agent-loop", config=config, max_turns=5)
        runs = await tt.turns(session_id="agent-loop")
    # Three identical calls are in the window when the fourth turn's call is checked.
    assert [turn.status for turn in sorted(runs, key=lambda t: t.started_at)] == [
        "completed",
        "completed",
        "completed",
        "failed",
    ]


@pytest.mark.parametrize("local_model", [False, True])
async def test_cancelling_a_run_during_its_model_call(
    stack: StackFactory, local_model: bool
) -> None:
    # The turn ends cancelled, not failed ("model call failed: Activity cancelled"). A local
    # model call runs inside the turn's workflow task, so the cancellation reaches the turn
    # only when that task next completes: the task heartbeat the SDK sends while a local
    # activity outlives the task timeout (every ~8 s with the default 10 s timeout).
    async with stack(Host([add], model=SlowModel())) as tt:
        handle = await tt.start_agent(
            "wait", session_id=f"agent-cancel-{local_model}", local_model=local_model
        )
        turn_id = f"{handle.run_id}-turn-0"
        for _ in range(200):
            if await tt.store.turn(turn_id) is not None or await _started(tt, turn_id):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        asked = time.monotonic()
        await handle.cancel()
        with pytest.raises(TurnCancelled):
            await handle.result()
        waited = time.monotonic() - asked
        turn = await _ended(tt, turn_id)
    assert waited < 20, f"the cancellation took {waited:.1f} s"
    assert turn is not None and turn.status == "cancelled"


async def _ended(tt: Tooltrail, turn_id: str) -> TurnRecord | None:
    """The turn's row once it has left "running" (its final write follows the result)."""
    turn = None
    for _ in range(100):
        turn = await tt.store.turn(turn_id)
        if turn is not None and turn.status != "running":
            break
        await asyncio.sleep(0.1)
    return turn


async def _started(tt: Tooltrail, workflow_id: str) -> bool:
    try:
        history = await tt.client.get_workflow_handle(workflow_id).fetch_history()
    except Exception:
        return False
    return any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED for e in history.events)


async def test_a_failing_scratch_cleanup_fails_neither_the_run_nor_close_session(
    temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    # The cleanup is best effort: once its retries are spent the run still gives its answer,
    # and closing the session answers that nothing was removed.
    host = Host([add], model=ScriptedModel([text_response("done")]))
    store = AuditStore(sqlite_url)
    task_queue = f"tq-{uuid.uuid4()}"
    tt = Tooltrail(temporal_env.client, host, task_queue=task_queue, store=store)
    try:
        async with build_worker(
            temporal_env.client,
            host,
            task_queue=task_queue,
            store=store,
            scratch=BrokenScratch(tmp_path),
        ):
            result = await tt.run_agent("hi", session_id="agent-broken-scratch")
            closed = await tt.close_session("agent-broken-scratch")
    finally:
        await store.close()
    assert (result.text, result.stopped_by) == ("done", "answer")
    assert closed is False


# -- what the providers answer: stop reasons, refusals, thinking ----------------------------

RAN: list[dict[str, Any]] = []


@tool
def record(x: int) -> str:
    """Record a number (the tests check that it never ran)."""
    RAN.append({"x": x})
    return "recorded"


@tool
def fail_quietly() -> str:
    """Fail without saying why."""
    raise ToolError("")


def provider_client(provider: str, server: LLMServer) -> OpenAIChatClient | AnthropicMessagesClient:
    if provider == "openai":
        return OpenAIChatClient(server.url, api_key="k", model="m")
    return AnthropicMessagesClient(base_url=server.url, api_key="k", model="c")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_tool_call_cut_off_by_max_tokens_is_never_run(
    stack: StackFactory, provider: str
) -> None:
    # The model ran out of tokens in the middle of its call: the arguments may be cut short,
    # so the call is not run, and the run fails saying which budget to raise.
    RAN.clear()
    with LLMServer() as server:
        server.reply(
            body=openai_completion(None, [("c1", "record", '{"x": 1')], finish_reason="length")
            if provider == "openai"
            else anthropic_message(
                {"type": "tool_use", "id": "t1", "name": "record", "input": {"x": 1}},
                stop_reason="max_tokens",
            )
        )
        run_id = f"run-cut-{provider}"
        async with stack(Host([record], model=provider_client(provider, server))) as tt:
            with pytest.raises(TurnFailed) as failed:
                await tt.run_agent(
                    "record 1",
                    session_id=run_id,
                    run_id=run_id,
                    model=ModelSettings(max_tokens=64),
                )
            events = await tt.audit(f"{run_id}-turn-0")
            conversation = await tt.conversation(run_id)
    assert str(failed.value) == (
        f"turn '{run_id}' failed: TurnFailed: model call failed: ModelOutputTruncated: the "
        "model's answer was cut off by max_tokens=64 in the middle of its tool calls (record); "
        "none of them was run: raise ModelSettings.max_tokens"
    )
    assert RAN == []
    assert len(server.requests) == 1  # final: not asked again
    assert [e.kind for e in events] == ["turn_started", "turn_end"]
    assert [m.role for m in conversation] == ["user"]


async def test_an_answer_that_thinking_used_up_fails_the_run(stack: StackFactory) -> None:
    # The thinking took the whole budget: no text, no call. Not an empty "answer".
    with LLMServer() as server:
        server.reply(
            body=anthropic_message(
                {"type": "thinking", "thinking": "Let me think at length", "signature": "s"},
                stop_reason="max_tokens",
            )
        )
        async with stack(Host([record], model=provider_client("anthropic", server))) as tt:
            with pytest.raises(
                TurnFailed,
                match=r"before it said anything \(thinking may have used the whole budget\): "
                r"raise ModelSettings.max_tokens or lower its thinking budget$",
            ):
                await tt.run_agent(
                    "think", session_id="agent-thought", model=ModelSettings(thinking=1024)
                )


async def test_a_refusal_is_the_runs_answer(stack: StackFactory) -> None:
    with LLMServer() as server:
        server.reply(body=openai_completion(None, refusal="I can't help with that."))
        async with stack(Host([record], model=provider_client("openai", server))) as tt:
            result = await tt.run_agent("something bad", session_id="agent-refused")
            conversation = await tt.conversation(result.run_id)
    assert (result.text, result.stop_reason, result.stopped_by) == (
        "I can't help with that.",
        "refusal",
        "answer",
    )
    assert conversation[-1].refusal == "I can't help with that."


THINKING = [
    Thinking(thinking="2 + 3: the add tool will do.", signature="U0lHTkFUVVJFLTE="),
    Thinking(type="redacted_thinking", data="RU5DUllQVEVELTE="),
]


async def test_thinking_goes_back_with_the_tool_results(stack: StackFactory, db_url: str) -> None:
    # Extended thinking on: the answer's thinking blocks are kept in the conversation (SQL)
    # and sent back, unchanged and first, with the tool results; no history holds them.
    blocks = [
        {"type": "thinking", "thinking": THINKING[0].thinking, "signature": THINKING[0].signature},
        {"type": "redacted_thinking", "data": THINKING[1].data},
        {"type": "text", "text": "Adding."},
        {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}},
    ]
    with LLMServer() as server:
        server.reply(
            body=anthropic_message(
                *blocks,
                stop_reason="tool_use",
                input_tokens=10,
                cache_creation_input_tokens=1500,
                output_tokens=40,
            )
        )
        server.reply(
            body=anthropic_message(
                {"type": "text", "text": "5"},
                input_tokens=30,
                cache_read_input_tokens=1500,
                output_tokens=2,
            )
        )
        async with stack(
            Host([add], model=provider_client("anthropic", server)), database_url=db_url
        ) as tt:
            result = await tt.run_agent(
                "What is 2 + 3?",
                session_id=f"agent-thinking-{uuid.uuid4().hex[:6]}",
                system="Be brief.",
                model=ModelSettings(thinking=2048, prompt_caching=True),
            )
            conversation = await tt.conversation(result.run_id)
            histories = [
                raw(await tt.client.get_workflow_handle(workflow_id).fetch_history())
                for workflow_id in [result.run_id, *result.turns]
            ]
    assert (result.text, result.stop_reason) == ("5", "end_turn")
    first, second = (r.body for r in server.requests)
    assert first["thinking"] == second["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert first["max_tokens"] == 8192 + 2048
    assert first["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    ]
    assert first["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert second["messages"][1:] == [
        {"role": "assistant", "content": blocks},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"}],
        },
    ]
    assert conversation[2].thinking == THINKING
    for data in histories:
        assert THINKING[0].signature.encode() not in data
        assert THINKING[1].data.encode() not in data
    # Every prompt token counted, the cache's share on its own.
    assert result.usage == Usage(
        input_tokens=1510 + 1530,
        output_tokens=42,
        cache_read_tokens=1500,
        cache_write_tokens=1500,
    )


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_an_empty_tool_error_reaches_the_model_with_a_fixed_text(
    stack: StackFactory, provider: str
) -> None:
    with LLMServer() as server:
        if provider == "openai":
            server.reply(body=openai_completion(None, [("c1", "fail_quietly", "{}")]))
            server.reply(body=openai_completion("It failed."))
        else:
            server.reply(
                body=anthropic_message(
                    {"type": "tool_use", "id": "c1", "name": "fail_quietly", "input": {}},
                    stop_reason="tool_use",
                )
            )
            server.reply(body=anthropic_message({"type": "text", "text": "It failed."}))
        async with stack(Host([fail_quietly], model=provider_client(provider, server))) as tt:
            result = await tt.run_agent("try it", session_id=f"agent-quiet-{provider}")
            conversation = await tt.conversation(result.run_id)
    assert result.text == "It failed."
    tool_message = next(m for m in conversation if m.role == "tool")
    assert (tool_message.content, tool_message.is_error) == ("", True)  # as the tool said
    sent = server.requests[1].body["messages"][-1]
    text = "tool 'fail_quietly' failed without a message"
    if provider == "openai":
        assert sent == {"role": "tool", "tool_call_id": "c1", "content": text}
    else:
        assert sent == {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": text, "is_error": True}
            ],
        }
