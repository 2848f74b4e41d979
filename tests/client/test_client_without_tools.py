"""A client with no tool code: the workers decide everything about the tools.

A web backend that only starts turns imports no tool: the advertised names, the tools'
settings (``local``, timeouts), the parallel-safety verdicts, the memoize paths and the
session's state are decided on the worker, where the tools live (``tooltrail.turn.prepare``
for a standalone turn, the model activity for an agent turn).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

import tooltrail
from tests.conftest import StackFactory
from tests.faults.history import local_activities
from tooltrail import Host, RunConfig, ToolCall, Tooltrail, tool
from tooltrail.core.memoize import MemoizingMiddleware
from tooltrail.core.messages import ModelRequest, ModelResponse
from tooltrail.core.wire import TOOL_EXECUTE, TURN_PREPARE
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response

spans: dict[str, tuple[float, float]] = {}


@tool(concurrent_safe=True)
async def nap(label: str) -> str:
    """Sleep a little, noting when."""
    begun = time.monotonic()
    await asyncio.sleep(0.3)
    spans[label] = (begun, time.monotonic())
    return f"{label} rested"


@tool(local=True)
def shout(text: str) -> str:
    """Upper-case the text (a local activity)."""
    return text.upper()


@tool
def lookup(key: str) -> str:
    """Answer with the key (memoized by the worker's host)."""
    spans[f"lookup-{key}-{time.monotonic()}"] = (0.0, 0.0)
    return f"value of {key}"


WORKER_HOST = Host([nap, shout, lookup], middleware=[MemoizingMiddleware(["lookup"])])


def toolless(worker_side: Tooltrail) -> Tooltrail:
    """A client of the same deployment that knows no tool at all."""
    return Tooltrail(worker_side.client, task_queue=worker_side.task_queue, store=worker_side.store)


def scheduled(history: WorkflowHistory) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def test_a_client_without_tools_runs_turns_as_the_workers_plan_them(
    stack: StackFactory,
) -> None:
    spans.clear()
    async with stack(WORKER_HOST) as worker_side:
        # The client knows no tool at all.
        tt = Tooltrail(
            worker_side.client, task_queue=worker_side.task_queue, store=worker_side.store
        )
        assert tt.host.registry.names() == []
        first = await tt.run_turn(
            [
                ToolCall("n1", "nap", {"label": "a"}),
                ToolCall("n2", "nap", {"label": "b"}),
                ToolCall("s1", "shout", {"text": "hi"}),
                ToolCall("l1", "lookup", {"key": "k"}),
                ToolCall("g1", "ghost", {}),
            ],
            session_id="no-tools",
            config=RunConfig(dispatch="parallel"),
        )
        second = await tt.run_turn([ToolCall("l2", "lookup", {"key": "k"})], session_id="no-tools")
        history = await tt.client.get_workflow_handle(first.turn_id).fetch_history()
        events = await tt.audit(first.turn_id)
        state = await tt.store.session_state("no-tools")
    assert [(r.output, r.is_error) for r in first.results] == [
        ("a rested", False),
        ("b rested", False),
        ("HI", False),
        ("value of k", False),
        ("tool 'ghost' is not available", True),
    ]
    # Advertised: the worker's tools (the client named none).
    started = events[0]
    assert started.kind == "turn_started"
    assert started.payload["advertised"] == ["lookup", "nap", "shout"]
    # The worker judged the naps safe: they overlapped.
    (a_start, a_end), (b_start, b_end) = spans["a"], spans["b"]
    assert a_start < b_end and b_start < a_end
    # The worker's @tool(local=True): shout never went through the server's task queue.
    assert TOOL_EXECUTE in scheduled(history)
    assert scheduled(history).count(TOOL_EXECUTE) == 3  # nap, nap, lookup
    assert [d["activity_type"] for d in local_activities(history)][:2] == [
        TURN_PREPARE,
        TOOL_EXECUTE,
    ]
    # The worker's memoize cache, carried by the session's state the worker read: a hit.
    assert second.results[0].output == "value of k\n[cached]"
    assert len([k for k in spans if k.startswith("lookup-")]) == 1
    assert state.version == 2


async def test_connect_needs_no_host(
    stack: StackFactory, temporal_env: WorkflowEnvironment, sqlite_url: str
) -> None:
    address = temporal_env.client.service_client.config.target_host
    async with (
        stack(WORKER_HOST) as worker_side,
        tooltrail.connect(
            temporal_address=address,
            namespace=temporal_env.client.namespace,
            task_queue=worker_side.task_queue,
            database_url=sqlite_url,
        ) as tt,
    ):
        turn = await tt.run_turn([ToolCall("c1", "shout", {"text": "far"})], session_id="c")
        trail = [e.kind for e in await tt.audit(turn.turn_id)]
    assert (turn.results[0].output, turn.results[0].is_error) == ("FAR", False)
    assert trail[0] == "turn_started" and trail[-1] == "turn_end"


async def test_an_agent_run_from_a_client_without_tools(
    stack: StackFactory, tmp_path: Path
) -> None:
    seen: list[list[str]] = []

    def step(request: ModelRequest) -> ModelResponse:
        seen.append([spec["function"]["name"] for spec in request.tools])
        if len(seen) == 1:
            return tool_call_response(
                ("c1", "shout", {"text": "go"}), ("c2", "nap", {"label": "z"})
            )
        return text_response("done")

    host = Host([nap, shout], model=ScriptedModel([step, step]), scratch_base=tmp_path)
    async with stack(host) as worker_side:
        tt = Tooltrail(
            worker_side.client, task_queue=worker_side.task_queue, store=worker_side.store
        )
        result = await tt.run_agent("go", session_id="agent-no-tools")
        turn = await tt.get_turn(result.turns[0]).result()
    assert result.text == "done"
    assert seen == [["nap", "shout"], ["nap", "shout"]]
    assert [r.output for r in turn.results] == ["GO", "z rested"]
