"""Agent runs from the command line (issue 20, item 6): ``audit show RUN``, ``cancel``,
``run`` against a cluster, and ``fork`` (with ``Tooltrail.fork_agent``).

The commands run as real subprocesses against the session's Temporal server, whose worker
runs in this process (so the CLI is called in a thread: the worker keeps polling meanwhile).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tests.support.cli_runner import error_lines, run_cli
from tooltrail import ConfigurationError, Host, ToolCall, Tooltrail, TurnCancelled, tool
from tooltrail.core.messages import ModelRequest, ModelResponse
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
async def slow() -> str:
    """Take a long time."""
    await asyncio.sleep(30)
    return "late"


async def cli(
    args: list[str], tmp_path: Path, tt: Tooltrail, database_url: str, env: WorkflowEnvironment
) -> subprocess.CompletedProcess[str]:
    """Run ``tooltrail ARGS`` against the test's server, task queue and database."""
    return await asyncio.to_thread(
        run_cli,
        args,
        tmp_path,
        TOOLTRAIL_TEMPORAL_ADDRESS=env.client.service_client.config.target_host,
        TOOLTRAIL_TASK_QUEUE=tt.task_queue,
        TOOLTRAIL_DATABASE_URL=database_url,
    )


def two_tool_turns_then(answer: str) -> list[Any]:
    return [
        tool_call_response(("c1", "add", {"a": 1, "b": 2})),
        tool_call_response(("c2", "add", {"a": 3, "b": 4})),
        text_response(answer),
    ]


async def test_audit_show_of_a_run_lists_its_turns_and_conversation(
    stack: StackFactory, db_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    host = Host([add], model=ScriptedModel(two_tool_turns_then("seven and three")))
    async with stack(host, database_url=db_url) as tt:
        result = await tt.run_agent("add things", session_id=f"s-{uuid.uuid4()}")
        shown = await cli(
            ["audit", "show", result.run_id, "--json"], tmp_path, tt, db_url, temporal_env
        )
        text = await cli(["audit", "show", result.run_id], tmp_path, tt, db_url, temporal_env)
        unknown = await cli(["audit", "show", "run-nosuch"], tmp_path, tt, db_url, temporal_env)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert [t["turn_id"] for t in data["turns"]] == result.turns
    assert [t["status"] for t in data["turns"]] == ["completed"] * 3
    assert [t["call_count"] for t in data["turns"]] == [1, 1, 0]
    assert [m["role"] for m in data["conversation"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert data["conversation"][0]["content"] == "add things"
    assert data["conversation"][-1]["content"] == "seven and three"
    assert data["links"] == []
    assert text.returncode == 0, text.stderr
    for turn_id in result.turns:
        assert turn_id in text.stdout  # whole, never cut short
    assert "add [c2]" in text.stdout and "seven and three" in text.stdout
    assert unknown.returncode == 1
    assert len(error_lines(unknown.stderr)) == 1, unknown.stderr
    assert (
        "no turn 'run-nosuch' in the audit database, nor an agent run of that id" in unknown.stderr
    )
    assert "Traceback" not in unknown.stderr


async def _until_turn_runs(tt: Tooltrail, turn_id: str) -> None:
    for _ in range(400):
        try:
            description = await tt.client.get_workflow_handle(turn_id).describe()
        except Exception:
            await asyncio.sleep(0.05)
            continue
        if description.status is not None:
            await asyncio.sleep(0.5)  # let the slow tool start
            return
    raise AssertionError(f"turn {turn_id} never started")


async def test_cancel_a_run_a_turn_and_a_finished_one(
    stack: StackFactory, sqlite_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    script = [tool_call_response(("c1", "slow", {}))]
    async with stack(Host([slow], model=ScriptedModel(script))) as tt:
        run = await tt.start_agent("wait", session_id=f"s-{uuid.uuid4()}")
        await _until_turn_runs(tt, f"{run.run_id}-turn-0")
        cancelled = await cli(["cancel", run.run_id], tmp_path, tt, sqlite_url, temporal_env)
        with pytest.raises(TurnCancelled):
            await run.result()
        again = await cli(["cancel", run.run_id], tmp_path, tt, sqlite_url, temporal_env)
        turn = await tt.start_turn([ToolCall("c9", "slow", {})], session_id=f"s-{uuid.uuid4()}")
        await _until_turn_runs(tt, turn.turn_id)
        turn_cancel = await cli(
            ["cancel", turn.turn_id, "--json"], tmp_path, tt, sqlite_url, temporal_env
        )
        with pytest.raises(TurnCancelled):
            await turn.result()
        unknown = await cli(["cancel", "nosuch-id"], tmp_path, tt, sqlite_url, temporal_env)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"cancellation of run {run.run_id} requested" in cancelled.stdout
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == (
        f"run {run.run_id} has already finished (canceled); nothing to cancel"
    )
    assert turn_cancel.returncode == 0, turn_cancel.stderr
    assert json.loads(turn_cancel.stdout) == {
        "id": turn.turn_id,
        "kind": "turn",
        "cancelled": True,
        "status": "running",
    }
    assert unknown.returncode == 1
    assert len(error_lines(unknown.stderr)) == 1, unknown.stderr
    assert "nosuch-id" in unknown.stderr and "Traceback" not in unknown.stderr


async def test_run_against_a_cluster_detached_and_waiting(
    stack: StackFactory, sqlite_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    host = Host([add], model=ScriptedModel([text_response("first"), text_response("second")]))
    address = temporal_env.client.service_client.config.target_host
    async with stack(host) as tt:
        common = ["--temporal-address", address, "--task-queue", tt.task_queue]
        detached = await cli(
            ["run", "hello", *common, "--detach"], tmp_path, tt, sqlite_url, temporal_env
        )
        assert detached.returncode == 0, detached.stderr
        run_id = detached.stdout.strip()
        answer = await tt.client.get_workflow_handle(run_id).result()
        waited = await cli(
            ["run", "again", *common, "--json"], tmp_path, tt, sqlite_url, temporal_env
        )
        conversation = await tt.conversation(run_id)
    assert run_id.startswith("run-")
    assert answer["text"] == "first"
    assert conversation[0].content == "hello"
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["text"] == "second"
    embedded = await asyncio.to_thread(run_cli, ["run", "hello", "--detach"], tmp_path)
    assert embedded.returncode == 1
    assert error_lines(embedded.stderr) == [
        "error: --detach needs --temporal-address: the embedded server stops with the command"
    ]


def _echo(answer: str, seen: list[ModelRequest]) -> Any:
    def step(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        return text_response(answer)

    return step


async def test_fork_from_turn_k_copies_the_prefix_and_links_both_runs(
    stack: StackFactory, db_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    seen: list[ModelRequest] = []
    script = [*two_tool_turns_then("original"), _echo("forked", seen), _echo("replaced", seen)]
    async with stack(Host([add], model=ScriptedModel(script)), database_url=db_url) as tt:
        original = await tt.run_agent("add things", session_id=f"s-{uuid.uuid4()}")
        before = await tt.conversation(original.run_id)
        forked = await cli(
            ["fork", original.run_id, "--from-turn", "1", "--wait", "--json"],
            tmp_path,
            tt,
            db_url,
            temporal_env,
        )
        assert forked.returncode == 0, forked.stderr
        fork = json.loads(forked.stdout)
        fork_id = fork["run_id"]
        fork_conversation = await tt.conversation(fork_id)
        replaced = await tt.fork_agent(original.run_id, from_turn=0, message="multiply instead")
        replaced_result = await replaced.result()
        replaced_conversation = await tt.conversation(replaced.run_id)
        shown_original = await cli(
            ["audit", "show", original.run_id], tmp_path, tt, db_url, temporal_env
        )
        shown_fork = await cli(
            ["audit", "show", fork_id, "--json"], tmp_path, tt, db_url, temporal_env
        )
        original_links = await tt.run_links(original.run_id)
        # A fork copies the original's conversation; it never writes there.
        assert await tt.conversation(original.run_id) == before
        beyond = await cli(
            ["fork", original.run_id, "--from-turn", "3"], tmp_path, tt, db_url, temporal_env
        )
        negative = await cli(
            ["fork", original.run_id, "--from-turn", "-1"], tmp_path, tt, db_url, temporal_env
        )
        with pytest.raises(ConfigurationError, match="has turns 0 to 2: cannot fork from turn 7"):
            await tt.fork_agent(original.run_id, from_turn=7)
        with pytest.raises(ConfigurationError, match="no agent run 'run-nosuch'"):
            await tt.fork_agent("run-nosuch", from_turn=0)
        # An id Temporal refuses (a workflow of that id exists): no link, no copy is left.
        with pytest.raises(ConfigurationError, match="exists already"):
            await tt.fork_agent(original.run_id, from_turn=1, new_run_id=original.turns[0])
        assert len(await tt.run_links(original.run_id)) == 2
        assert await tt.conversation(original.turns[0]) == []
    # The fork's conversation is the original's up to turn 1 (what its model call read),
    # then its own answer; its model was asked with exactly that prefix.
    prefix = before[:3]
    assert [m.role for m in prefix] == ["user", "assistant", "tool"]
    assert fork_conversation[:3] == prefix
    assert fork_conversation[3].content == "forked"
    assert [m.content for m in seen[0].messages] == [m.content for m in prefix]
    assert fork["result"]["text"] == "forked"
    assert fork["result"]["turns"] == [f"{fork_id}-turn-1"]  # turn numbers go on
    assert fork["forked_from"] == original.run_id and fork["from_turn"] == 1
    # With a message: the last user message before turn 0 replaced, nothing else copied.
    assert [m.content for m in replaced_conversation] == ["multiply instead", "replaced"]
    assert seen[1].messages[-1].content == "multiply instead"
    assert replaced_result.text == "replaced"
    # Both trails show the link.
    assert shown_original.returncode == 0, shown_original.stderr
    assert f"forked to {fork_id} at turn 1" in shown_original.stdout
    assert (
        f"forked to {replaced.run_id} at turn 0 (last user message replaced)"
        in shown_original.stdout
    )
    assert [link.direction for link in original_links] == ["forked_to", "forked_to"]
    fork_links = json.loads(shown_fork.stdout)["links"]
    assert [link["text"] for link in fork_links] == [f"forked from {original.run_id} at turn 1"]
    assert [t["turn_id"] for t in json.loads(shown_fork.stdout)["turns"]] == [f"{fork_id}-turn-1"]
    for bad, text in ((beyond, "cannot fork from turn 3"), (negative, "must be 0 or more")):
        assert bad.returncode == 1, bad.stderr
        assert len(error_lines(bad.stderr)) == 1, bad.stderr
        assert text in bad.stderr and "Traceback" not in bad.stderr


async def test_a_fork_keeps_the_originals_model_and_a_fork_of_a_fork_counts_the_same(
    stack: StackFactory,
) -> None:
    seen: list[ModelRequest] = []
    script = [
        *two_tool_turns_then("original"),
        tool_call_response(("c3", "add", {"a": 5, "b": 6})),
        _echo("fork answer", seen),
        _echo("fork of fork", seen),
    ]
    async with stack(Host([add], model=ScriptedModel(script))) as tt:
        original = await tt.run_agent("add", session_id=f"s-{uuid.uuid4()}", model="m-orig")
        before = await tt.conversation(original.run_id)
        fork = await tt.fork_agent(original.run_id, from_turn=1)
        fork_result = await fork.result()
        fork_conversation = await tt.conversation(fork.run_id)
        # Turn 2 of the fork is its own (the copy holds turns 0 and 1 of the original).
        second = await tt.fork_agent(fork.run_id, from_turn=2, model="m-other")
        await second.result()
        second_conversation = await tt.conversation(second.run_id)
        links = await tt.run_links(fork.run_id)
    assert [r.text for r in (original, fork_result)] == ["original", "fork answer"]
    assert fork_result.turns == [f"{fork.run_id}-turn-1", f"{fork.run_id}-turn-2"]
    assert fork_conversation[:3] == before[:3]
    assert seen[0].model == "m-orig"  # the original's settings, read from its history
    assert second_conversation[:5] == fork_conversation[:5]
    assert [m.content for m in seen[1].messages] == [m.content for m in fork_conversation[:5]]
    assert seen[1].model == "m-other"
    assert [(link.direction, link.from_turn) for link in links] == [
        ("forked_from", 1),
        ("forked_to", 2),
    ]
