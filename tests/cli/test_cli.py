"""The ``tooltrail`` command, run as a real subprocess against real servers and databases."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

import tooltrail
from tests.support import crash_tools
from tests.support.cli_runner import ROOT, TOOLTRAIL, env_for, run_cli
from tooltrail import ConfigurationError, Host, ToolCall
from tooltrail.cli import load_host
from tooltrail.db.migrate import head_revision
from tooltrail.runtime.embedded import DEV_SERVER_ARGS


def run(args: list[str], tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_cli(args, tmp_path, timeout=timeout)


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["demo"],
        ["dev"],
        ["worker"],
        ["audit"],
        ["audit", "list"],
        ["audit", "show"],
        ["db", "upgrade"],
        ["db", "current"],
        ["run"],
        ["replay"],
        ["rerun"],
        ["history", "export"],
        ["approve"],
        ["codec-server"],
        ["deny"],
        ["approvals"],
    ],
)
def test_every_command_has_help(tmp_path: Path, command: list[str]) -> None:
    done = run([*command, "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Usage" in done.stdout


def test_db_upgrade_and_current(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    done = run(["db", "upgrade", "--database-url", url], tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"database at revision {head_revision()}" in done.stdout
    current = run(["db", "current", "--database-url", url], tmp_path)
    assert f"current: {head_revision()}" in current.stdout


def test_worker_refuses_an_unmigrated_database(
    tmp_path: Path, temporal_env: WorkflowEnvironment
) -> None:
    address = temporal_env.client.service_client.config.target_host
    done = run(
        [
            "worker",
            "--tools",
            "tests.support.crash_tools:host",
            "--temporal-address",
            address,
            "--database-url",
            f"sqlite:///{tmp_path / 'empty.db'}",
        ],
        tmp_path,
    )
    assert done.returncode == 1
    assert "tooltrail db upgrade" in done.stderr


def test_load_host_accepts_hosts_registries_and_lists() -> None:
    assert load_host("tests.support.crash_tools:host") is crash_tools.host
    assert load_host("tests.support.crash_tools:echo").registry.names() == ["echo"]
    with pytest.raises(ConfigurationError, match="MODULE:ATTR"):
        load_host("tests.support.crash_tools")
    with pytest.raises(ConfigurationError, match="cannot import"):
        load_host("no_such_module_here:host")
    with pytest.raises(ConfigurationError, match="has no attribute"):
        load_host("tests.support.crash_tools:nothing")
    with pytest.raises(ConfigurationError, match="expected a Host"):
        load_host("tests.support.crash_tools:ROOT_NOT_THERE".replace("ROOT_NOT_THERE", "HOSTS"))


async def test_worker_process_serves_a_connected_client_and_audit_commands(
    tmp_path: Path, temporal_env: WorkflowEnvironment, sqlite_url: str
) -> None:
    address = temporal_env.client.service_client.config.target_host
    task_queue = f"cli-{uuid.uuid4()}"
    proc = await asyncio.create_subprocess_exec(
        *TOOLTRAIL,
        "worker",
        "--tools",
        "tests.support.crash_tools:host",
        cwd=ROOT,
        env={
            **env_for(tmp_path),
            "TOOLTRAIL_TEMPORAL_ADDRESS": address,
            "TOOLTRAIL_TASK_QUEUE": task_queue,
            "TOOLTRAIL_DATABASE_URL": sqlite_url,
        },
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        seen = []
        for _ in range(50):  # log lines may come first
            line = await asyncio.wait_for(proc.stderr.readline(), timeout=60)
            seen.append(line)
            if b"worker up" in line or not line:
                break
        assert b"worker up" in seen[-1], seen
        async with tooltrail.connect(
            Host(crash_tools.host.registry),
            temporal_address=address,
            task_queue=task_queue,
            database_url=sqlite_url,
        ) as tt:
            turn = await tt.run_turn(
                [ToolCall("c1", "echo", {"text": "via the CLI worker"}), ToolCall("c2", "x", {})],
                session_id="cli-session",
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), timeout=60)
    assert code == 0, "SIGTERM stops the worker cleanly"
    assert turn.results[0].output == "via the CLI worker"

    listed = run(["audit", "list", "--json", "--database-url", sqlite_url], tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["turn_id"], r["status"], r["session_id"]) for r in rows] == [
        (turn.turn_id, "completed", "cli-session")
    ]
    errors_only = run(
        ["audit", "list", "--errors", "--json", "--database-url", sqlite_url], tmp_path
    )
    assert json.loads(errors_only.stdout) == []

    shown = run(["audit", "show", turn.turn_id, "--json", "--database-url", sqlite_url], tmp_path)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["turn"]["status"] == "completed"
    assert [e["kind"] for e in data["events"]] == [
        "turn_started",
        "tool_call_received",
        "tool_call_received",
        "tool_pre",
        "tool_post",
        "turn_end",
    ]
    table = run(["audit", "show", turn.turn_id, "--database-url", sqlite_url], tmp_path)
    assert "tool_post" in table.stdout and "via the CLI worker" in table.stdout
    assert "tool 'x' is not available" in table.stdout

    missing = run(["audit", "show", "nope", "--database-url", sqlite_url], tmp_path)
    assert missing.returncode == 1 and "no turn 'nope'" in missing.stderr


def test_demo_runs_a_real_turn(tmp_path: Path) -> None:
    done = run(["demo", "--json"], tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)  # stdout is the JSON alone: no server banner, no log line
    outputs = {r["tool_call_id"]: (r["output"], r["is_error"]) for r in data["results"]}
    assert outputs == {
        "call_1": ("saved 33 characters to note 'plan'", False),
        "call_2": ("Ship tooltrail. Audit everything.", False),
        "call_3": ("35", False),
        "call_4": ('{"words":5,"characters":29}', False),
        "call_5": ("no note named 'missing'; notes: plan", True),
        "call_6": ("tool 'fetch_weather' panicked: weather service unreachable for Lisbon", True),
        "call_7": ("tool 'send_email' is not available", True),
        "call_8": (outputs["call_8"][0], True),
    }
    assert outputs["call_8"][0].startswith("invalid arguments: not valid JSON")
    kinds = [e["kind"] for e in data["audit"]]
    assert kinds[0] == "turn_started" and kinds[-1] == "turn_end"
    assert kinds.count("tool_call_received") == 8
    assert (tmp_path / "xdg" / "tooltrail" / "tooltrail.db").is_file()
    agent = data["agent"]
    assert (agent["stopped_by"], len(agent["turns"])) == ("answer", 4)
    assert agent["text"].startswith("The note says tooltrail makes tool calls durable")
    roles = [m["role"] for m in data["conversation"]]
    assert roles[:3] == ["system", "user", "assistant"] and roles[-1] == "assistant"


@pytest.mark.parametrize("flags", [[], ["--local-model"]])
def test_run_a_one_shot_agent_against_an_openai_compatible_server(
    tmp_path: Path, flags: list[str]
) -> None:
    from tests.support.llm_server import LLMServer, openai_completion

    with LLMServer() as server:
        server.reply(
            body=openai_completion(tool_calls=[("c1", "calculate", '{"expression": "2+2"}')])
        )
        server.reply(body=openai_completion("2 + 2 = 4"))
        done = run_cli(
            ["run", "What is 2 + 2?", "--json", *flags],
            tmp_path,
            timeout=180,
            TOOLTRAIL_OPENAI_BASE_URL=server.url,
            TOOLTRAIL_OPENAI_API_KEY="sk-test-secret",
            TOOLTRAIL_MODEL="test-model",
        )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # the JSON alone
    assert (result["text"], len(result["turns"])) == ("2 + 2 = 4", 2)
    assert server.requests[1].body["messages"][-1]["content"] == "4"
    assert server.requests[0].headers.get("authorization") == "Bearer sk-test-secret"
    assert "sk-test-secret" not in done.stdout + done.stderr


@tooltrail.tool
def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


async def test_local_hands_the_dev_server_its_own_arguments(tmp_path: Path) -> None:
    # A limit tooltrail's defaults leave alone: ids (workflow and request ids) of at most 40.
    args = [*DEV_SERVER_ARGS, "--dynamic-config-value", "limit.maxIDLength=40"]
    url = f"sqlite:///{tmp_path}/local.db"
    call = ToolCall("c1", "shout", {"text": "hi"})
    async with tooltrail.local([shout], database_url=url, server_args=args) as tt:
        turn = await tt.run_turn([call], session_id="s", turn_id="turn-short")
        with pytest.raises(RPCError, match=r"WorkflowId exceeds maximum allowed length \(45/40\)"):
            await tt.run_turn([call], session_id="s", turn_id="turn-" + "x" * 40)
    assert turn.results[0].output == "HI"
