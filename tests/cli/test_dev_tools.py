"""``tooltrail dev --tools`` and the issue's case through the CLI (issue 20 item 5).

``tooltrail dev`` runs a worker with the demo tools; ``tooltrail worker --tools
tests.support.cli_tools:host`` polls the same task queue with other tools. Every call of
either set must come back from a worker that has its tool, never "Tool not found".
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from tests.cli.test_dev_output import free_port
from tests.support.cli_runner import ROOT, TOOLTRAIL, env_for, error_lines, run_cli
from tooltrail import ToolCall
from tooltrail.client import Tooltrail
from tooltrail.db.store import AuditStore
from tooltrail.pipeline.directory import RegistryDirectory
from tooltrail.runtime.worker import connect_client

TURNS = 30


def test_dev_with_tools_that_cannot_be_imported_fails_in_one_line(tmp_path: Path) -> None:
    done = run_cli(["dev", "--tools", "nosuch:x", "--no-persist"], tmp_path, timeout=60)
    assert done.returncode == 1, done.stderr[-2000:]
    [line] = error_lines(done.stderr)
    assert "nosuch" in line
    assert "Traceback" not in done.stderr


@contextlib.asynccontextmanager
async def _command(args: list[str], tmp_path: Path, ready: bytes | None) -> AsyncIterator[str]:
    """Run ``tooltrail ARGS`` until the block ends (SIGINT); yield what it printed by ``ready``."""
    proc = await asyncio.create_subprocess_exec(
        *TOOLTRAIL,
        *args,
        cwd=ROOT,
        env=env_for(tmp_path, TOOLTRAIL_SQLITE_SHARED="1"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    seen = b""
    try:
        while ready is not None and ready not in seen:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=120)
            assert line, (seen, await proc.stderr.read())
            seen += line
        yield seen.decode()
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.communicate(), timeout=60)


async def _turns(port: int, task_queue: str, url: str, calls: list[str]) -> list[list[str]]:
    """Wait until the queue's registries serve ``calls``; run TURNS turns calling each once."""
    client = await connect_client(f"127.0.0.1:{port}")
    store = AuditStore(url)
    try:
        probe = RegistryDirectory(client, store, task_queue, {}, ttl_s=0.0)
        for _ in range(600):
            if all([await probe.peer_queue_for(name) for name in calls]):
                break
            await asyncio.sleep(0.1)
        tt = Tooltrail(client, task_queue=task_queue, store=store)
        arguments = {"calculate": {"expression": "6*7"}, "lookup": {"key": "k"}}

        async def turn(i: int) -> list[str]:
            result = await tt.run_turn(
                [ToolCall(f"{i}-{name}", name, arguments[name]) for name in calls],
                session_id=f"dev-{i}",
            )
            return [f"{r.output}{' (error)' if r.is_error else ''}" for r in result.results]

        return list(await asyncio.gather(*(turn(i) for i in range(TURNS))))
    finally:
        await store.close()


async def test_dev_and_a_worker_with_other_tools_share_a_queue(tmp_path: Path) -> None:
    port, task_queue = free_port(), f"tq-{uuid.uuid4()}"
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    common = ["--task-queue", task_queue, "--database-url", url]
    dev = ["dev", "--port", str(port), "--ui-port", str(free_port()), "--no-persist", *common]
    address = ["--temporal-address", f"127.0.0.1:{port}"]
    worker = ["worker", "--tools", "tests.support.cli_tools:host", *address, *common]
    async with (
        _command(dev, tmp_path, b"Press Ctrl-C") as printed,
        _command(worker, tmp_path, None),
    ):
        results = await _turns(port, task_queue, url, ["calculate", "lookup"])
    assert "Tools: calculate, fetch_weather, read_note, word_count, write_note" in printed
    assert results == [["42", "k=v1"]] * TURNS


async def test_dev_runs_the_tools_it_is_given(tmp_path: Path) -> None:
    port, task_queue = free_port(), f"tq-{uuid.uuid4()}"
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    dev = [
        "dev",
        "--tools",
        "tests.support.cli_tools:host",
        "--port",
        str(port),
        "--ui-port",
        str(free_port()),
        "--no-persist",
        "--task-queue",
        task_queue,
        "--database-url",
        url,
    ]
    async with _command(dev, tmp_path, b"Press Ctrl-C") as printed:
        client = await connect_client(f"127.0.0.1:{port}")
        store = AuditStore(url)
        try:
            tt = Tooltrail(client, task_queue=task_queue, store=store)
            result = await tt.run_turn(
                [ToolCall("a", "lookup", {"key": "k"}), ToolCall("b", "calculate", {})],
                session_id="dev-tools",
            )
        finally:
            await store.close()
    assert "Tools: echo, lookup, transfer" in printed
    assert (result.results[0].output, result.results[0].is_error) == ("k=v1", False)
    # The demo tools are not this worker's: never advertised.
    assert result.results[1].output == "tool 'calculate' is not available"
