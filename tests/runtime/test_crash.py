"""Real crashes: a worker process is SIGKILLed in the middle of a tool attempt.

Temporal notices through the missed heartbeats and retries the *same* attempt on another
worker. The audit trail must hold every event exactly once, the events of the attempt must
not fire again, and a ``retry_on_interrupt=False`` tool must report the interruption instead
of running a second time.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from tests.support import crash_tools
from tooltrail import FixedDelay, Host, RunConfig, ToolCall, Tooltrail
from tooltrail.core.messages import Message
from tooltrail.core.wire import AgentRunOutput, AuditEvent
from tooltrail.db.store import AuditStore
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response
from tooltrail.runtime.worker import build_worker

pytestmark = pytest.mark.crash
ROOT = Path(__file__).resolve().parents[2]


async def start_worker_process(
    address: str, task_queue: str, url: str, host: str = "plain"
) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "tests" / "support" / "crash_worker.py"),
        address,
        task_queue,
        url,
        host,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
    assert line.strip() == b"ready", line
    return proc


async def echo_around_a_killer(
    temporal_env: WorkflowEnvironment, sqlite_url: str, tool_name: str
) -> tuple[Any, list[Any], Any]:
    """Run echo, ``tool_name`` (which kills the worker process running it), echo.

    A worker process starts the turn and dies in ``tool_name``; a second worker takes over
    once Temporal notices (a lost heartbeat, or a workflow task that timed out). Returns
    the turn's output, its audit events and its history.
    """
    address = temporal_env.client.service_client.config.target_host
    task_queue = f"crash-{uuid.uuid4()}"
    store = AuditStore(sqlite_url)
    tt = Tooltrail(temporal_env.client, crash_tools.host, task_queue=task_queue, store=store)
    try:
        doomed = await start_worker_process(address, task_queue, sqlite_url)
        handle = await tt.start_turn(
            [
                ToolCall("c1", "echo", {"text": "before"}),
                ToolCall("c2", tool_name, {}),
                ToolCall("c3", "echo", {"text": "after"}),
            ],
            session_id=f"crash-{tool_name}",
            config=RunConfig(heartbeat_timeout_s=2),
        )
        assert await asyncio.wait_for(doomed.wait(), timeout=60) == -9
        async with build_worker(
            temporal_env.client, crash_tools.host, task_queue=task_queue, store=store
        ):
            turn = await asyncio.wait_for(handle.result(), timeout=60)
        events = await tt.audit(turn.turn_id)
        history = await handle.workflow_handle.fetch_history()
    finally:
        await store.close()
    return turn, events, history


@pytest.mark.parametrize(
    ("tool_name", "expected_output", "expected_runs"),
    [
        ("fragile", "fragile survived", 2),
        (
            "fragile_once",
            "tool 'fragile_once' was interrupted before it reported a result; "
            "it may or may not have taken effect",
            1,
        ),
    ],
)
async def test_worker_killed_mid_attempt(
    temporal_env: WorkflowEnvironment,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tool_name: str,
    expected_output: str,
    expected_runs: int,
) -> None:
    monkeypatch.setenv("TOOLTRAIL_CRASH_DIR", str(tmp_path))
    turn, events, history = await echo_around_a_killer(temporal_env, sqlite_url, tool_name)

    assert [r.output for r in turn.results] == ["before", expected_output, "after"]
    assert turn.results[1].is_error is (tool_name == "fragile_once")
    assert crash_tools.runs(tool_name) == expected_runs
    # Exactly once: seq is contiguous, and the retried attempt fired no event again.
    assert [e.seq for e in events] == list(range(len(events)))
    per_call = Counter((e.kind, e.tool_call_id) for e in events)
    assert all(count == 1 for count in per_call.values()), per_call
    recovery = ["recovery_decision"] if turn.results[1].is_error else []
    assert [e.kind for e in events if e.tool_call_id == "c2"] == [
        "tool_call_received",
        "tool_pre",
        "tool_post",
        *recovery,
    ]
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    assert 2 in attempts, "the killed attempt was retried by Temporal"


async def test_worker_killed_mid_local_attempt(
    temporal_env: WorkflowEnvironment,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # @tool(local=True)'s documented trade-off: the attempt ran inside the lost worker's
    # workflow task, so the worker that takes over (once that task times out) runs it again.
    monkeypatch.setenv("TOOLTRAIL_CRASH_DIR", str(tmp_path))
    turn, events, _ = await echo_around_a_killer(temporal_env, sqlite_url, "fragile_local")

    assert [r.output for r in turn.results] == ["before", "fragile_local survived", "after"]
    assert crash_tools.runs("fragile_local") == 2
    # The trail is still exactly once: the records are rebuilt from the history on replay.
    assert [e.seq for e in events] == list(range(len(events)))
    per_call = Counter((e.kind, e.tool_call_id) for e in events)
    assert all(count == 1 for count in per_call.values()), per_call


async def test_worker_killed_during_a_backoff(
    temporal_env: WorkflowEnvironment,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLTRAIL_CRASH_DIR", str(tmp_path))
    address = temporal_env.client.service_client.config.target_host
    task_queue = f"crash-{uuid.uuid4()}"
    store = AuditStore(sqlite_url)
    tt = Tooltrail(
        temporal_env.client, crash_tools.recovering_host, task_queue=task_queue, store=store
    )
    try:
        doomed = await start_worker_process(address, task_queue, sqlite_url, "recovering")
        handle = await tt.start_turn(
            [ToolCall("c1", "fails_once", {}), ToolCall("c2", "echo", {"text": "after"})],
            session_id="crash",
            config=RunConfig(recovery=FixedDelay(2, 3000)),
        )
        # Kill the worker while the 3 s backoff timer is pending on the server.
        for _ in range(400):
            history = await handle.workflow_handle.fetch_history()
            if any(e.event_type == EventType.EVENT_TYPE_TIMER_STARTED for e in history.events):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the backoff timer never started")
        doomed.kill()
        assert await doomed.wait() == -9
        async with build_worker(
            temporal_env.client, crash_tools.recovering_host, task_queue=task_queue, store=store
        ):
            turn = await asyncio.wait_for(handle.result(), timeout=60)
        events = await tt.audit(turn.turn_id)
    finally:
        await store.close()

    assert [r.output for r in turn.results] == ["second run worked", "after"]
    assert crash_tools.runs("fails_once") == 2
    assert [e.seq for e in events] == list(range(len(events)))
    per_event = Counter((e.kind, e.tool_call_id, e.attempt) for e in events)
    assert all(count == 1 for count in per_event.values()), per_event
    assert [(e.kind, e.attempt) for e in events if e.tool_call_id == "c1"] == [
        ("tool_call_received", None),
        ("tool_pre", 0),
        ("tool_post", 0),
        ("recovery_decision", 0),
        ("tool_pre", 1),
        ("tool_post", 1),
    ]


async def test_crash_after_an_idempotent_outcome_committed(
    temporal_env: WorkflowEnvironment,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Spec scenario 27: attempt 1 commits its outcome, then the worker dies; attempt 2 must
    # find the outcome instead of charging again.
    monkeypatch.setenv("TOOLTRAIL_CRASH_DIR", str(tmp_path))
    address = temporal_env.client.service_client.config.target_host
    task_queue = f"crash-{uuid.uuid4()}"
    store = AuditStore(sqlite_url)
    survivor_host = Host(crash_tools.idempotent_host.registry)
    tt = Tooltrail(temporal_env.client, survivor_host, task_queue=task_queue, store=store)
    try:
        doomed = await start_worker_process(address, task_queue, sqlite_url, "idempotent")
        handle = await tt.start_turn(
            [ToolCall("c1", "charge", {"amount": 5})],
            session_id="crash",
            config=RunConfig(heartbeat_timeout_s=2),
        )
        assert await asyncio.wait_for(doomed.wait(), timeout=60) == -9
        async with build_worker(
            temporal_env.client, survivor_host, task_queue=task_queue, store=store
        ):
            turn = await asyncio.wait_for(handle.result(), timeout=60)
        events = await tt.audit(turn.turn_id)
    finally:
        await store.close()
    assert turn.results[0].output == "charged 5"
    assert crash_tools.runs("charge") == 1, "the side effect happened once"
    post = next(e for e in events if e.kind == "tool_post")
    # Spec §5.5: the row of the attempt that did the side effect committed with its
    # completion, so the kill between them lost nothing: the retry (the same attempt, on
    # Temporal's attempt 2) reports that row, not a cache hit of its own.
    assert (post.payload["dispatch"]["status"], post.payload["dispatch"]["source_call_id"]) == (
        "ok",
        None,
    )
    assert post.payload["dispatch"]["attempt"] == 1
    assert post.payload["dispatch"]["value"] == "charged 5"
    assert post.temporal_attempt == 2
    assert [lost["temporal_attempt"] for lost in post.payload["lost_attempts"]] == [1]


async def agent_run_around_a_killer(
    temporal_env: WorkflowEnvironment,
    sqlite_url: str,
    doomed_host: str,
    survivor: Host,
    **options: Any,
) -> tuple[AgentRunOutput, list[Message], list[AuditEvent], WorkflowHistory]:
    """Start an agent run on a worker process that dies in it; ``survivor`` finishes it.

    ``doomed_host`` names the dying worker's host in ``crash_tools.HOSTS``; ``options`` go
    to ``start_agent``. Returns the run's result, its conversation, and its first turn's
    audit trail and history.
    """
    address = temporal_env.client.service_client.config.target_host
    task_queue = f"crash-{uuid.uuid4()}"
    store = AuditStore(sqlite_url)
    tt = Tooltrail(temporal_env.client, survivor, task_queue=task_queue, store=store)
    try:
        doomed = await start_worker_process(address, task_queue, sqlite_url, doomed_host)
        handle = await tt.start_agent("go", session_id=f"crash-{doomed_host}", **options)
        assert await asyncio.wait_for(doomed.wait(), timeout=60) == -9
        async with build_worker(
            temporal_env.client,
            survivor,
            task_queue=task_queue,
            store=store,
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
        ):
            result = await asyncio.wait_for(handle.result(), timeout=90)
        conversation = await tt.conversation(result.run_id)
        first_turn = await tt.audit(result.turns[0])
        history = await tt.client.get_workflow_handle(result.turns[0]).fetch_history()
    finally:
        await store.close()
    return result, conversation, first_turn, history


def assert_each_event_once(trail: list[AuditEvent]) -> None:
    """The trail is numbered without gaps and holds no event twice."""
    assert [e.seq for e in trail] == list(range(len(trail)))
    per_event = Counter((e.kind, e.tool_call_id, e.attempt, e.payload.get("phase")) for e in trail)
    assert all(count == 1 for count in per_event.values()), per_event


async def test_worker_killed_mid_agent_run(
    temporal_env: WorkflowEnvironment,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLTRAIL_CRASH_DIR", str(tmp_path))
    survivor_model = ScriptedModel([text_response("recovered and done")])
    survivor = Host(crash_tools.agent_host.registry, model=survivor_model)
    result, conversation, first_turn, _ = await agent_run_around_a_killer(
        temporal_env, sqlite_url, "agent", survivor
    )
    assert (result.text, len(result.turns)) == ("recovered and done", 2)
    # The first model answer was stored before the crash and never asked for again.
    assert len(survivor_model.requests) == 1
    assert [m.role for m in conversation] == ["user", "assistant", "tool", "assistant"]
    assert conversation[2].content == "fragile survived"
    assert crash_tools.runs("fragile") == 2, "the interrupted tool ran again (at least once)"
    assert_each_event_once(first_turn)


async def test_worker_killed_mid_local_model_call(
    temporal_env: WorkflowEnvironment,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # local_model=True's documented trade-off: the call ran inside the lost worker's workflow
    # task, so the worker that takes over (once that task times out) asks the model again.
    monkeypatch.setenv("TOOLTRAIL_CRASH_DIR", str(tmp_path))
    survivor_model = ScriptedModel(
        [tool_call_response(("m1", "echo", {"text": "still here"})), text_response("done")]
    )
    survivor = Host(crash_tools.dying_model_host.registry, model=survivor_model)
    result, conversation, first_turn, history = await agent_run_around_a_killer(
        temporal_env, sqlite_url, "dying_model", survivor, local_model=True
    )
    assert (result.text, len(result.turns)) == ("done", 2)
    assert crash_tools.runs("model") == 1, "the doomed worker's call never answered"
    assert len(survivor_model.requests) == 2, "the lost call was made again"
    assert [(m.role, m.content) for m in conversation] == [
        ("user", "go"),
        ("assistant", ""),
        ("tool", "still here"),
        ("assistant", "done"),
    ]
    # The lost workflow task left nothing behind: one model answer, a trail exactly once.
    timed_out = [
        e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
    ]
    assert timed_out, "the first workflow task died with its worker"
    assert_each_event_once(first_turn)
    assert [e.kind for e in first_turn][:2] == ["turn_started", "model_response"]
