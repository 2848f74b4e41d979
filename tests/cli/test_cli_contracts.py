"""The command line's contracts for scripts and CI, through the real ``tooltrail`` process.

Pure JSON on stdout with ``--json``; exit 0 done, 1 an error (one ``error:`` line, no
traceback), 3 a check that found something; ids shown whole; data never read as markup.
The workers run in the test process (``stack``), so every command is run in a thread.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tests.support import cli_tools
from tests.support.cli_runner import error_lines, run_cli
from tooltrail import RunConfig, ToolCall, Tooltrail
from tooltrail.db.migrate import head_revision, upgrade
from tooltrail.ops.reruns import NOT_RECORDED

TOOLS = "tests.support.cli_tools:host"


def address_of(env: WorkflowEnvironment) -> str:
    return str(env.client.service_client.config.target_host)


async def cli(
    args: list[str], tmp_path: Path, *, input: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run the command in a thread, so the worker of this process keeps working meanwhile."""
    return await asyncio.to_thread(run_cli, args, tmp_path, input=input, **env)


def one_error(done: subprocess.CompletedProcess[str], *expected: str) -> str:
    """Check the everyday-mistake contract and return the error line."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    [line] = error_lines(done.stderr)
    for text in expected:
        assert text in line, line
    return line


def pure_json(done: subprocess.CompletedProcess[str]) -> Any:
    """The whole of stdout is one JSON document."""
    return json.loads(done.stdout)


# -- everyday mistakes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["worker", "--tools", "nosuch:x"], "cannot import 'nosuch' for --tools"),
        (["rerun", "turn-x", "--tools", "nosuch:x"], "cannot import 'nosuch'"),
        (["run", "hi", "--tools", "tests.support.cli_tools:nothing"], "has no attribute 'nothing'"),
        (["worker", "--tools", "tests.support.cli_tools"], "must look like MODULE:ATTR"),
    ],
)
def test_a_bad_tools_path_is_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    one_error(run_cli(args, tmp_path), expected)


async def test_unknown_ids_are_one_line(
    temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    address = ["--temporal-address", address_of(temporal_env)]
    database = ["--database-url", sqlite_url]
    for args, expected in [
        (["approve", "turn-nope", "c1", *address], "no such turn 'turn-nope'"),
        (["deny", "turn-nope", "c1", "--reason", "no", *address], "no such turn 'turn-nope'"),
        (["approvals", "turn-nope", *address], "no such turn 'turn-nope'"),
        (["history", "export", "run-nope", *address], "workflow not found for ID: run-nope"),
        (["audit", "show", "turn-nope", *database], "no turn 'turn-nope' in the audit database"),
        (
            ["rerun", "turn-nope", "--tools", TOOLS, "--yes", *address, *database],
            "the audit trail has no turn 'turn-nope'",
        ),
    ]:
        one_error(await cli(args, tmp_path), *expected.split("|"))


# -- approvals for operators -----------------------------------------------------------------


async def waiting(tt: Tooltrail, turn_id: str) -> None:
    for _ in range(200):
        if await tt.get_turn(turn_id).pending_approvals():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{turn_id} never asked")


async def test_approvals_across_turns_and_answers_that_come_too_late(
    stack: StackFactory, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    address = ["--temporal-address", address_of(temporal_env)]
    config = RunConfig(interactive=True, approval_timeout_s=900)
    async with stack(cli_tools.host) as tt:
        first = await tt.start_turn(
            [ToolCall("pay-1", "transfer", {"amount": 5})], session_id="ops", config=config
        )
        await waiting(tt, first.turn_id)
        second = await tt.start_turn(
            [ToolCall("[/]pay-2", "transfer", {"amount": 7})], session_id="ops", config=config
        )
        await waiting(tt, second.turn_id)

        listed = await cli(["approvals", "--all", "--json", *address], tmp_path)
        assert listed.returncode == 0, listed.stderr
        mine = [a for a in pure_json(listed) if a["turn_id"] in {first.turn_id, second.turn_id}]
        assert [(a["turn_id"], a["tool_call_id"], a["question"]) for a in mine] == [
            (first.turn_id, "pay-1", "move 5?"),
            (second.turn_id, "[/]pay-2", "move 7?"),
        ], "oldest first"
        for item in mine:
            assert 0 <= item["age_s"] < 120
            assert item["deadline"] is not None and item["asked_at"] is not None

        table = await cli(["approvals", "--all", *address], tmp_path, COLUMNS="60")
        assert table.returncode == 0, table.stderr
        assert first.turn_id in table.stdout and second.turn_id in table.stdout, table.stdout
        assert "[/]pay-2" in table.stdout, "a call id is shown as it is, never as markup"
        assert "(in 14m" in table.stdout, "the deadline, 15 minutes after the ask"

        one_turn = await cli(["approvals", first.turn_id, "--json", *address], tmp_path)
        assert [a["tool_call_id"] for a in pure_json(one_turn)] == ["pay-1"]

        not_waiting = await cli(["approve", first.turn_id, "pay-9", *address], tmp_path)
        one_error(not_waiting, "'pay-9' is not waiting for approval", "approvals --all")

        approved = await cli(["approve", first.turn_id, "pay-1", "--by", "ops", *address], tmp_path)
        assert approved.returncode == 0, approved.stderr
        assert (await first.result()).results[0].output == "moved 5"
        again = await cli(["approve", first.turn_id, "pay-1", *address], tmp_path)
        one_error(again, f"turn {first.turn_id!r} has ended (completed)", "no longer waiting")
        ended = await cli(["approvals", first.turn_id, "--json", *address], tmp_path)
        assert (ended.returncode, pure_json(ended)) == (0, [])

        denied = await cli(
            ["deny", second.turn_id, "[/]pay-2", "--reason", "[red]no", *address], tmp_path
        )
        assert denied.returncode == 0, denied.stderr
        assert "[/]pay-2" in denied.stdout
        assert (await second.result()).results[0].output == "[red]no"


# -- rerun: confirmation, exit codes, shadow truth --------------------------------------------


async def test_rerun_asks_says_whose_code_runs_and_exits_3_on_differences(
    stack: StackFactory, temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    cli_tools.behaviour.update(suffix="v1", block=False)
    async with stack(cli_tools.host) as tt:
        options = ["--tools", TOOLS, "--temporal-address", address_of(temporal_env)]
        options += ["--task-queue", tt.task_queue, "--database-url", sqlite_url]
        original = await tt.run_turn(
            [ToolCall("a", "lookup", {"key": "x"}), ToolCall("b", "lookup", {"key": "y"})],
            session_id="rerun-cli",
        )
        turns_before = len(await tt.turns(limit=100))

        refused = await cli(["rerun", original.turn_id, *options], tmp_path)
        one_error(refused, "not confirmed", "2 tool calls", "--yes", "--shadow")
        assert f"workers of task queue {tt.task_queue!r}" in refused.stderr
        assert "not --tools" in refused.stderr
        assert len(await tt.turns(limit=100)) == turns_before, "nothing ran"

        args = ["rerun", original.turn_id, *options, "--json"]
        confirmed = await cli(args, tmp_path, input="y\n")
        assert confirmed.returncode == 0, confirmed.stderr
        assert "lookup x2" in confirmed.stderr, "the question names what runs again"
        report = pure_json(confirmed)
        assert (report["mode"], report["divergences"]) == ("rerun", [])

        cli_tools.behaviour["suffix"] = "v2"
        changed = await cli(["rerun", original.turn_id, *options, "--yes"], tmp_path)
        assert changed.returncode == 3, changed.stderr
        assert "x=v1" in changed.stdout and "x=v2" in changed.stdout

        # The original refused by a hook that now allows the call: the shadow has no result
        # to serve and says so, instead of serving the old refusal as the tool's output.
        cli_tools.behaviour["block"] = True
        blocked = await tt.run_turn([ToolCall("c", "lookup", {"key": "z"})], session_id="rerun-cli")
        assert blocked.results[0].output == "lookups are off today"
        cli_tools.behaviour["block"] = False
        shadow = await cli(["rerun", blocked.turn_id, *options, "--shadow", "--json"], tmp_path)
    assert shadow.returncode == 3, shadow.stderr
    divergences = {(d["tool_call_id"], d["aspect"]): d for d in pure_json(shadow)["divergences"]}
    assert divergences[("c", "shadow")]["now"] == NOT_RECORDED
    assert divergences[("c", "shadow")]["original"] == "lookups are off today"
    assert divergences[("c", "decisions")]["original"] == ["hook block"]
    assert ("c", "output") not in divergences


async def test_the_core_logs_through_tooltrails_handler_and_stdout_stays_json(
    stack: StackFactory, temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    async with stack(cli_tools.host) as tt:
        # 600 KB of arguments: the Temporal core warns about the payload (over 512 KB) when
        # the CLI starts the shadow turn. The trail keeps only a note of arguments that large
        # (and the output apart): the shadow takes both back from the history and the store,
        # so it serves the very same call and output.
        turn = await tt.run_turn(
            [ToolCall("big", "echo", {"text": "x" * 600_000})], session_id="core-logs"
        )
        where = ["--temporal-address", address_of(temporal_env), "--task-queue", tt.task_queue]
        args = ["rerun", turn.turn_id, "--shadow", "--json", "--tools", TOOLS, *where]
        done = await cli(
            [*args, "--database-url", sqlite_url], tmp_path, TOOLTRAIL_LOG_FORMAT="json"
        )
    assert done.returncode == 0, done.stderr
    assert pure_json(done)["divergences"] == []
    core = [
        json.loads(line)
        for line in done.stderr.splitlines()
        if line.startswith("{") and "temporalio.core" in line
    ]
    assert core, done.stderr
    assert core[0]["level"] == "WARNING" and "TMPRL1103" in core[0]["message"]
    assert "TMPRL1103" not in done.stdout


# -- the other exit codes and JSON outputs -----------------------------------------------------


async def test_db_current_fails_a_gate_when_the_database_is_behind(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gate.db'}"
    behind = await cli(["db", "current", "--database-url", url], tmp_path)
    assert behind.returncode == 3, behind.stderr
    assert "tooltrail db upgrade" in behind.stderr
    as_json = await cli(["db", "current", "--json", "--database-url", url], tmp_path)
    assert (as_json.returncode, pure_json(as_json)) == (
        3,
        {"current": None, "head": head_revision(), "up_to_date": False},
    )
    await upgrade(url)
    current = await cli(["db", "current", "--json", "--database-url", url], tmp_path)
    assert (current.returncode, pure_json(current)["up_to_date"]) == (0, True)


def test_config_show_json_is_pure(tmp_path: Path) -> None:
    done = run_cli(["config", "show", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert pure_json(done)["task_queue"] == "tooltrail"


# -- tables: whole ids, data never read as markup ----------------------------------------------


async def test_tables_show_whole_ids_and_data_as_it_is(
    stack: StackFactory, sqlite_url: str, tmp_path: Path
) -> None:
    session = "[bold]session-" + "s" * 60
    turn_id = "turn-[/]-" + "t" * 70
    async with stack(cli_tools.host) as tt:
        await tt.run_turn(
            [ToolCall("[/]", "echo", {"text": "[red]not red"}), ToolCall("c" * 80, "nope", {})],
            session_id=session,
            turn_id=turn_id,
        )
    database = ["--database-url", sqlite_url]
    listed = await cli(["audit", "list", *database], tmp_path, COLUMNS="50")
    assert listed.returncode == 0, listed.stderr
    assert turn_id in listed.stdout and session in listed.stdout, listed.stdout
    shown = await cli(["audit", "show", turn_id, *database], tmp_path, COLUMNS="60")
    assert shown.returncode == 0, shown.stderr
    for text in (turn_id, session, "c" * 80, "[red]not red", "│ [/]"):
        assert text in shown.stdout, (text, shown.stdout)
    as_json = await cli(["audit", "show", turn_id, "--json", *database], tmp_path)
    assert pure_json(as_json)["turn"]["session_id"] == session
    assert pure_json(await cli(["audit", "list", "--json", *database], tmp_path))[0]["turn_id"] == (
        turn_id
    )
