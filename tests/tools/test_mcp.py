"""MCP toolsets against a real MCP server process (``tests/support/mcp_server.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from mcp.types import CallToolResult, ImageContent, TextContent
from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tests.support.mcp_server import BROKEN_MESSAGE
from tooltrail import ConfigurationError, Host, ToolCall, ToolRegistry, tool
from tooltrail.core.results import ImagePart, TextPart, ToolOutput
from tooltrail.errors import DuplicateToolError, RegistryFrozenError, ToolError
from tooltrail.tools.mcp import McpServerUnavailable, McpToolset, register_mcp_server, result_value

SERVER = str(Path(__file__).resolve().parents[1] / "support" / "mcp_server.py")
COMMAND = [sys.executable, SERVER]

Toolset = tuple[ToolRegistry, McpToolset]


def pids(pid_file: Path) -> list[int]:
    if not pid_file.exists():
        return []
    return [int(line) for line in pid_file.read_text().split()]


@pytest.fixture
def pid_file(tmp_path: Path) -> Path:
    return tmp_path / "mcp.pids"


@pytest.fixture
async def toolset(pid_file: Path, tmp_path: Path) -> AsyncIterator[Toolset]:
    registry = ToolRegistry()
    toolset = await register_mcp_server(
        registry,
        command=COMMAND,
        prefix="srv_",
        env={
            "MCP_TEST_PID_FILE": str(pid_file),
            "MCP_TEST_REFUSE_FILE": str(tmp_path / "refuse"),
        },
    )
    try:
        yield registry, toolset
    finally:
        await toolset.aclose()


async def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    # Give the transport a moment to see the pipes close; the test must not depend on it.
    await asyncio.sleep(0.2)


async def test_tools_are_registered_with_prefix_description_and_schema(toolset: Toolset) -> None:
    registry, tools = toolset
    assert registry.names() == ["srv_broken", "srv_slow"]
    assert tools.tools == {"srv_broken": "broken", "srv_slow": "slow"}
    specs = {spec.name: spec for spec in registry.tools()}
    assert specs["srv_slow"].kind == "dynamic"
    assert specs["srv_slow"].description == "Wait ``seconds``, then say so."
    schema = specs["srv_slow"].parameters
    assert schema["type"] == "object"
    assert schema["required"] == ["seconds"]
    assert schema["properties"]["seconds"]["type"] == "number"


async def test_turn_dispatches_both_tools_with_soft_error_and_audit(
    stack: StackFactory, toolset: Toolset
) -> None:
    registry, _ = toolset
    async with stack(Host(registry)) as tt:
        turn = await tt.run_turn(
            [
                ToolCall("c1", "srv_slow", {"seconds": 0.1}),
                ToolCall("c2", "srv_broken", {}),
            ],
            session_id="mcp-session",
        )
        events = await tt.audit(turn.turn_id)
    slow, broken = turn.results
    assert (slow.tool_call_id, slow.is_error, slow.resolved_tool_name) == ("c1", False, "srv_slow")
    assert isinstance(slow.output, str) and slow.output.startswith("slept 0.1s in ")
    assert (broken.tool_call_id, broken.is_error) == ("c2", True)
    assert broken.output == f"Error executing tool broken: {BROKEN_MESSAGE}"

    received = [e for e in events if e.kind == "tool_call_received"]
    assert [(e.tool_call_id, e.tool_name) for e in received] == [
        ("c1", "srv_slow"),
        ("c2", "srv_broken"),
    ]
    assert received[0].payload["input"] == {"seconds": 0.1}
    posts = {e.tool_call_id: e for e in events if e.kind == "tool_post"}
    assert set(posts) == {"c1", "c2"}
    assert events[-1].kind == "turn_end"
    audited = {r["tool_call_id"]: r for r in events[-1].payload["results"]}
    assert audited["c1"]["is_error"] is False and audited["c1"]["output"] == slow.output
    assert audited["c2"]["is_error"] is True and BROKEN_MESSAGE in audited["c2"]["output"]


async def test_killed_server_is_restarted_by_the_next_call(
    stack: StackFactory, toolset: Toolset, pid_file: Path
) -> None:
    registry, tools = toolset
    async with stack(Host(registry)) as tt:
        first = await tt.run_turn([ToolCall("a", "srv_slow", {"seconds": 0})], session_id="s")
        [original] = pids(pid_file)
        assert first.results[0].output == f"slept 0s in {original}"

        await kill(original)
        second = await tt.run_turn([ToolCall("b", "srv_slow", {"seconds": 0})], session_id="s")
    [_, restarted] = pids(pid_file)
    assert restarted != original
    assert (second.results[0].is_error, second.results[0].output) == (
        False,
        f"slept 0s in {restarted}",
    )
    assert tools.reconnects == 1


async def test_server_killed_mid_call_reconnects_once_and_runs_the_call_again(
    toolset: Toolset, pid_file: Path
) -> None:
    _, tools = toolset
    [original] = pids(pid_file)
    call = asyncio.create_task(tools.call_tool("slow", {"seconds": 1.0}))
    await asyncio.sleep(0.3)
    await kill(original)
    result = await asyncio.wait_for(call, timeout=30)
    [_, restarted] = pids(pid_file)
    assert result.is_error is False
    block = result.content[0]
    assert isinstance(block, TextContent) and block.text == f"slept 1s in {restarted}"
    assert tools.reconnects == 1


async def test_closed_session_is_reopened(toolset: Toolset, pid_file: Path) -> None:
    _, tools = toolset
    await tools.kill_session()
    result = await tools.call_tool("slow", {"seconds": 0})
    assert not result.is_error
    assert len(pids(pid_file)) == 2


async def test_server_that_cannot_restart_gives_a_soft_error(
    stack: StackFactory, toolset: Toolset, pid_file: Path, tmp_path: Path
) -> None:
    registry, tools = toolset
    (tmp_path / "refuse").touch()
    await kill(pids(pid_file)[0])
    async with stack(Host(registry)) as tt:
        turn = await tt.run_turn([ToolCall("a", "srv_slow", {"seconds": 0})], session_id="s")
    result = turn.results[0]
    assert result.is_error
    assert isinstance(result.output, str)
    assert result.output.startswith("MCP server 'python")
    assert "is unavailable: Connection closed" in result.output
    # Exactly one reconnect was tried for the call.
    assert len(pids(pid_file)) == 1
    (tmp_path / "refuse").unlink()
    recovered = await tools.call_tool("slow", {"seconds": 0})
    assert not recovered.is_error


async def test_unknown_arguments_are_the_servers_to_judge(toolset: Toolset) -> None:
    registry, _ = toolset
    dyn = registry.resolve("srv_slow")
    with pytest.raises(ToolError, match="slow"):
        await dyn.fn({"seconds": "not a number"}, None)


# -- registration errors -----------------------------------------------------------------------


async def test_frozen_registry_is_refused_before_any_server_starts(pid_file: Path) -> None:
    registry = ToolRegistry()
    registry.freeze()
    with pytest.raises(RegistryFrozenError, match="before build_worker"):
        await register_mcp_server(
            registry, command=COMMAND, env={"MCP_TEST_PID_FILE": str(pid_file)}
        )
    assert pids(pid_file) == []


async def test_name_clash_registers_nothing_and_stops_the_server(pid_file: Path) -> None:
    @tool
    def srv_slow() -> str:
        return ""

    registry = ToolRegistry([srv_slow])
    with pytest.raises(DuplicateToolError, match=r"'srv_slow'.*prefix="):
        await register_mcp_server(
            registry, command=COMMAND, prefix="srv_", env={"MCP_TEST_PID_FILE": str(pid_file)}
        )
    assert registry.names() == ["srv_slow"]
    [pid] = pids(pid_file)
    await wait_gone(pid)


async def test_include_selects_tools_and_rejects_unknown_names() -> None:
    registry = ToolRegistry()
    async with await register_mcp_server(registry, command=COMMAND, include=["slow"]):
        assert registry.names() == ["slow"]
    with pytest.raises(ConfigurationError, match=r"no tools \['nope'\]"):
        await register_mcp_server(ToolRegistry(), command=COMMAND, include=["nope"])


async def test_server_that_does_not_start_is_reported(tmp_path: Path) -> None:
    with pytest.raises(
        McpServerUnavailable, match="MCP server 'missing' is unavailable: FileNotFoundError"
    ):
        await register_mcp_server(ToolRegistry(), command=[str(tmp_path / "missing")])
    refuse = tmp_path / "refuse"
    refuse.touch()
    with pytest.raises(McpServerUnavailable, match="Connection closed"):
        await register_mcp_server(
            ToolRegistry(), command=COMMAND, env={"MCP_TEST_REFUSE_FILE": str(refuse)}
        )


async def test_exactly_one_transport() -> None:
    with pytest.raises(ConfigurationError, match="exactly one"):
        await register_mcp_server(ToolRegistry())
    with pytest.raises(ConfigurationError, match="exactly one"):
        await register_mcp_server(ToolRegistry(), command=COMMAND, url="http://x")


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) still answers signal 0; read its state.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


async def wait_gone(pid: int) -> None:
    for _ in range(300):
        if not running(pid):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"MCP server process {pid} is still running")


# -- streamable HTTP ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class HttpServer:
    """``tests/support/mcp_server.py --http`` in a subprocess, restartable on the same port."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(
                [*COMMAND, "--http", str(self.port)], stdout=log, stderr=subprocess.STDOUT
            )
        for _ in range(400):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if self.process.poll() is not None:
                raise AssertionError(self.log_path.read_text())
            time.sleep(0.05)
        raise AssertionError(f"MCP HTTP server did not listen on {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpServer]:
    server = HttpServer(tmp_path / "http-server.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_streamable_http_server(http_server: HttpServer) -> None:
    registry = ToolRegistry()
    async with await register_mcp_server(
        registry, url=http_server.url, prefix="web_", headers={"X-Test": "1"}
    ) as tools:
        assert tools.label == http_server.url
        assert registry.names() == ["web_broken", "web_slow"]
        slow = registry.resolve("web_slow")
        broken = registry.resolve("web_broken")
        assert (await slow.fn({"seconds": 0}, None)).startswith("slept 0s in ")
        with pytest.raises(ToolError, match=BROKEN_MESSAGE):
            await broken.fn({}, None)

        # The server goes away: a soft error after one reconnect attempt...
        await asyncio.to_thread(http_server.stop)
        with pytest.raises(ToolError, match=r"MCP server 'http://.*' is unavailable"):
            await slow.fn({"seconds": 0}, None)
        # ...and once it is back, the next call reaches it again.
        await asyncio.to_thread(http_server.start)
        assert (await slow.fn({"seconds": 0}, None)).startswith("slept 0s in ")


# -- timeouts and results ----------------------------------------------------------------------


async def test_call_timeout_is_a_soft_error_and_the_session_survives(pid_file: Path) -> None:
    registry = ToolRegistry()
    async with await register_mcp_server(
        registry, command=COMMAND, call_timeout_s=0.3, env={"MCP_TEST_PID_FILE": str(pid_file)}
    ) as tools:
        slow = registry.resolve("slow")
        with pytest.raises(ToolError, match=r"MCP tool 'slow' timed out after 0.3s"):
            await slow.fn({"seconds": 5}, None)
        assert (await slow.fn({"seconds": 0}, None)).startswith("slept 0s in ")
        assert tools.reconnects == 0
    assert len(pids(pid_file)) == 1


def test_result_value_joins_text_and_keeps_images_and_structured_content() -> None:
    text = CallToolResult(
        content=[TextContent(text="one"), TextContent(text="two")], structured_content={"a": 1}
    )
    assert result_value(text, "t") == "one\ntwo"
    structured = CallToolResult(content=[], structured_content={"a": 1})
    assert result_value(structured, "t") == '{"a": 1}'
    image = CallToolResult(
        content=[TextContent(text="see"), ImageContent(data="aGk=", mime_type="image/png")]
    )
    assert result_value(image, "t") == ToolOutput(
        parts=[TextPart("see"), ImagePart("image/png", "aGk=")]
    )
    with pytest.raises(ToolError, match=r"^bad input$"):
        result_value(CallToolResult(content=[TextContent(text="bad input")], is_error=True), "t")
    with pytest.raises(ToolError, match="MCP tool 't' reported an error"):
        result_value(CallToolResult(content=[], is_error=True), "t")


# -- arguments checked against the input schema -------------------------------------------------


async def test_arguments_are_checked_against_the_servers_input_schema(
    stack: StackFactory, toolset: Toolset
) -> None:
    registry, _ = toolset
    async with stack(Host(registry)) as tt:
        turn = await tt.run_turn(
            [
                ToolCall("ok", "srv_slow", {"seconds": 0}),
                ToolCall("type", "srv_slow", {"seconds": "soon"}),
                ToolCall("missing", "srv_slow", {}),
            ],
            session_id="mcp-schema",
        )
    ok, wrong_type, missing = turn.results
    assert isinstance(ok.output, str) and ok.output.startswith("slept 0s in ")
    # Refused before the call, as any tool's guardrail: the server's own error would read
    # "Error executing tool slow: ...".
    assert (wrong_type.is_error, wrong_type.output) == (
        True,
        "guardrail violation: seconds: not a valid number",
    )
    assert (missing.is_error, missing.output) == (
        True,
        "guardrail violation: seconds: field required",
    )


def test_schema_problems_read_like_guardrail_items() -> None:
    from tooltrail.tools import ArgumentsRejected
    from tooltrail.tools.mcp import McpServerTool

    async def handler(arguments: dict[str, object], ctx: object) -> str:
        return "never"

    schema = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "maxLength": 5},
            "mode": {"enum": ["r", "w"]},
            "tags": {"type": "array", "items": {"type": "integer"}},
        },
        "required": ["path"],
        "additionalProperties": False,
    }
    found = McpServerTool("files_read", description="", parameters=schema, handler=handler)
    with pytest.raises(ArgumentsRejected) as rejected:
        found.validate({"path": "a" * 6, "mode": "x", "tags": [1, "two"], "other": 1})
    assert rejected.value.text.startswith("guardrail violation: ")
    assert rejected.value.items == (
        "other: unexpected argument",
        "mode: 'x' is not one of ['r', 'w']",
        "path: 'aaaaaa' is too long",
        "tags.1: not a valid integer",
    )
    with pytest.raises(ArgumentsRejected, match=r"^guardrail violation: path: field required$"):
        found.validate({})
    assert found.validate({"path": "x"}).arguments == {"path": "x"}
    lenient = McpServerTool("odd", description="", parameters={"type": "nonsense"}, handler=handler)
    assert lenient.validate({"anything": 1}).arguments == {"anything": 1}, "the server judges"


def test_server_specs_parse_prefix_command_and_url() -> None:
    from tooltrail.tools.mcp import McpServerSpec

    stdio = McpServerSpec.parse("gh=npx -y '@scope/server github' --flag=1")
    assert (stdio.prefix, stdio.command, stdio.url) == (
        "gh",
        ("npx", "-y", "@scope/server github", "--flag=1"),
        None,
    )
    assert stdio.tool_prefix == "gh_"
    web = McpServerSpec.parse("web-=https://example.test/mcp?x=1")
    assert (web.url, web.command, web.tool_prefix) == ("https://example.test/mcp?x=1", (), "web-")
    assert McpServerSpec.parse("=server").tool_prefix == ""
    for bad in ("no-equals", "gh=", "bad prefix=cmd", "p=unterminated 'quote"):
        with pytest.raises(ConfigurationError):
            McpServerSpec.parse(bad)


# -- tooltrail worker --mcp, and a client that learns the names ----------------------------------


async def test_worker_command_serves_mcp_tools_to_a_client_that_learns_their_names(
    temporal_env: WorkflowEnvironment,
    sqlite_url: str,
    tmp_path: Path,
    pid_file: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import uuid

    import tooltrail
    from tests.support import cli_tools
    from tests.support.cli_runner import ROOT, TOOLTRAIL, env_for

    address = temporal_env.client.service_client.config.target_host
    task_queue = f"mcp-cli-{uuid.uuid4()}"
    # The server gets no environment of the worker's but the basics: `env` hands it the pid file.
    server = f"srv=env MCP_TEST_PID_FILE={pid_file} {sys.executable} {SERVER}"
    proc = await asyncio.create_subprocess_exec(
        *TOOLTRAIL,
        "worker",
        "--tools",
        "tests.support.cli_tools:host",
        "--mcp",
        server,
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
        seen = b""
        while b"worker up" not in seen:
            line = await asyncio.wait_for(proc.stderr.readline(), timeout=60)
            assert line, seen.decode()
            seen += line
        assert b"(from MCP: srv_broken, srv_slow)" in seen, seen.decode()
        # The deployment's settings list the MCP server: the client learns from a worker.
        monkeypatch.setenv("TOOLTRAIL_MCP_SERVERS", json.dumps([server]))
        async with tooltrail.connect(
            cli_tools.host, temporal_address=address, task_queue=task_queue, database_url=sqlite_url
        ) as tt:
            assert tt.learn_worker_tools
            catalog = await tt.worker_tools()
            turn = await tt.run_turn(
                [
                    ToolCall("a", "srv_slow", {"seconds": 0}),
                    ToolCall("b", "srv_slow", {"seconds": "x"}),
                    ToolCall("c", "echo", {"text": "mine"}),
                ],
                session_id="mcp-cli",
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), timeout=60)
    assert code == 0
    assert {"srv_slow", "srv_broken", "echo"} <= set(catalog.names)
    [worker_server] = pids(pid_file)  # the client started no server of its own
    first, second, third = turn.results
    assert first.output == f"slept 0s in {worker_server}"
    assert second.output == "guardrail violation: seconds: not a valid number"
    assert third.output == "mine"
    await wait_gone(worker_server)  # the worker stopped its server
