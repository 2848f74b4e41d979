"""Operator tools: history export, determinism replay, rerun and shadow replay."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tests.support.cli_runner import run_cli
from tests.support.history_scenarios import HISTORIES
from tooltrail import Block, Host, PreToolUseContext, ToolCall, tool
from tooltrail.core.wire import TurnInput, TurnOutput
from tooltrail.ops.histories import load_histories, replay_histories
from tooltrail.workflows.agent import AgentRunWorkflow
from tooltrail.workflows.authorize import AuthorizeToolWorkflow
from tooltrail.workflows.catalog import ToolCatalogWorkflow
from tooltrail.workflows.session import CloseSessionWorkflow
from tooltrail.workflows.turn import TurnWorkflow

behaviour = {"suffix": "v1", "explode": False}


@tool
def lookup(key: str) -> str:
    """Answer from 'the world', which may change between runs."""
    if behaviour["explode"]:
        raise AssertionError("a shadow replay must never run a tool body")
    return f"{key}={behaviour['suffix']}"


async def test_export_then_replay_a_live_turn(
    stack: StackFactory, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    behaviour.update(suffix="v1", explode=False)
    address = temporal_env.client.service_client.config.target_host
    async with stack(Host([lookup])) as tt:
        for key in ("k1", "k2"):
            await tt.run_turn([ToolCall("c", "lookup", {"key": key})], session_id="ops")
        turn = await tt.run_turn([ToolCall("c", "lookup", {"key": "k"})], session_id="ops")
    target = tmp_path / "turn.json"
    exported = run_cli(
        ["history", "export", turn.turn_id, "-o", str(target), "--temporal-address", address],
        tmp_path,
    )
    assert exported.returncode == 0, exported.stderr
    assert json.loads(target.read_text())["events"][0]["eventType"] in {
        "EVENT_TYPE_WORKFLOW_EXECUTION_STARTED",
        "WorkflowExecutionStarted",
    }
    replayed = run_cli(["replay", str(target), "--json"], tmp_path)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert [o["ok"] for o in json.loads(replayed.stdout)] == [True]
    bulk = run_cli(
        [
            "history",
            "export",
            "--recent",
            "3",
            "-d",
            str(tmp_path / "bulk"),
            "--temporal-address",
            address,
        ],
        tmp_path,
    )
    assert bulk.returncode == 0, bulk.stderr
    assert len(list((tmp_path / "bulk").glob("*.json"))) == 3


def test_the_corpus_replays_from_the_command_line(tmp_path: Path) -> None:
    done = run_cli(["replay", str(HISTORIES)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 nondeterministic" in done.stdout


def test_a_tampered_history_fails_the_replay(tmp_path: Path) -> None:
    text = (
        (HISTORIES / "basic.json")
        .read_text()
        .replace("tooltrail.tool.execute", "tooltrail.tool.renamed", 1)
    )
    (tmp_path / "tampered.json").write_text(text)
    done = run_cli(["replay", str(tmp_path / "tampered.json")], tmp_path)
    assert done.returncode == 1
    assert "FAILED" in done.stdout and "1 nondeterministic" in done.stdout


@workflow.defn(name="TurnWorkflow", sandboxed=False)
class ChangedTurnWorkflow(TurnWorkflow):
    """A deploy that adds a timer before dispatch without ``workflow.patched``."""

    @workflow.run
    async def run(self, inp: TurnInput) -> TurnOutput:
        await workflow.sleep(timedelta(milliseconds=1))
        return await super().run(inp)


async def test_a_nondeterministic_change_is_caught_over_the_corpus() -> None:
    histories = load_histories([HISTORIES])
    workflows = [
        ChangedTurnWorkflow,
        CloseSessionWorkflow,
        AgentRunWorkflow,
        ToolCatalogWorkflow,
        AuthorizeToolWorkflow,
    ]
    report = await replay_histories(histories, workflows=workflows)
    others = ("close", "agent", "catalog", "authorize")
    turn_histories = [h for h in histories if not any(name in h[0] for name in others)]
    assert len(report.failures) == len(turn_histories)
    assert all(
        "Nondeterminism" in (f.error or "") or "nondetermin" in (f.error or "").lower()
        for f in report.failures
    )


async def test_rerun_reports_changed_tool_behaviour(stack: StackFactory) -> None:
    behaviour.update(suffix="v1", explode=False)
    async with stack(Host([lookup])) as tt:
        original = await tt.run_turn(
            [ToolCall("a", "lookup", {"key": "x"}), ToolCall("b", "ghost", {})], session_id="rerun"
        )
        behaviour["suffix"] = "v2"
        report = await tt.rerun(original.turn_id)
        row = await tt.store.turn(report.new_turn_id)
    assert report.mode == "rerun" and row is not None
    assert (row.rerun_of, row.mode) == (original.turn_id, "rerun")
    assert [(d.tool_call_id, d.aspect, d.original, d.now) for d in report.divergences] == [
        ("a", "output", "x=v1", "x=v2")
    ]


class BlockLookups:
    async def pre_tool(self, ctx: PreToolUseContext) -> Any:
        return Block("lookups are off today")


async def test_shadow_replay_runs_no_tool_and_reports_new_decisions(stack: StackFactory) -> None:
    behaviour.update(suffix="v1", explode=False)
    async with stack(Host([lookup])) as tt:
        original = await tt.run_turn(
            [ToolCall("a", "lookup", {"key": "x"}), ToolCall("b", "lookup", {"key": "y"})],
            session_id="shadow",
        )
        memory_before = await tt.memory("shadow")
        behaviour.update(suffix="changed", explode=True)  # any tool body would now fail loudly
        same = await tt.rerun(original.turn_id, shadow=True)
        memory_after = await tt.memory("shadow")
    assert same.mode == "shadow" and same.same, same.divergences
    assert len(memory_after) == len(memory_before), "a shadow replay writes no memory"
    async with stack(Host([lookup], hooks=[BlockLookups()])) as tt:
        blocked = await tt.rerun(original.turn_id, shadow=True)
    aspects = {(d.tool_call_id, d.aspect): (d.original, d.now) for d in blocked.divergences}
    assert aspects[("a", "decisions")] == ([], ["hook block"])
    assert aspects[("a", "output")] == ("x=v1", "lookups are off today")
    assert aspects[("b", "is_error")] == (False, True)


async def test_export_keeps_every_file_inside_the_directory(
    stack: StackFactory, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    behaviour.update(suffix="v1", explode=False)
    address = temporal_env.client.service_client.config.target_host
    outside = tmp_path / "outside"
    hostile = ["../outside/escaped", str(outside / "absolute"), "..", "a/b", "a_b"]
    async with stack(Host([lookup])) as tt:
        for turn_id in hostile:
            await tt.run_turn(
                [ToolCall("c", "lookup", {"key": "k"})], session_id="export", turn_id=turn_id
            )
    target = tmp_path / "export" / "bulk"
    recent = ["--recent", str(len(hostile)), "-d", str(target)]
    done = run_cli(["history", "export", *recent, "--temporal-address", address], tmp_path)
    assert done.returncode == 0, done.stderr
    assert not outside.exists()
    written = sorted(target.iterdir())
    assert all(path.parent == target and path.is_file() for path in written)
    assert "a_b.json" in {path.name for path in written}
    ids = {json.loads(path.read_text())["workflowId"] for path in written}
    assert ids == set(hostile), "one file per id, the id kept inside it"
    replayed = run_cli(["replay", str(target), "--json"], tmp_path)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert len(json.loads(replayed.stdout)) == len(hostile)
