"""The embedded dev server runs in an environment of its own, and says why when it cannot start."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest

from tests.support.cli_runner import run_cli
from tooltrail import ConfigurationError
from tooltrail.runtime import embedded
from tooltrail.runtime.embedded import server_environment, start_dev_server


def test_server_environment_keeps_only_what_a_process_needs() -> None:
    caller = {
        "PATH": "/usr/bin",
        "HOME": "/home/me",
        "TMPDIR": "/tmp/me",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
        "TEMPORAL_ADDRESS": "prod.example:7233",
        "TOOLTRAIL_CODEC_KEYS": "k:secret",
        "AWS_SECRET_ACCESS_KEY": "secret",
    }
    assert server_environment(caller) == {
        "PATH": "/usr/bin",
        "HOME": "/home/me",
        "TMPDIR": "/tmp/me",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
    }


async def test_the_dev_server_starts_whatever_otel_and_temporal_variables_the_caller_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "console")
    monkeypatch.setenv("TEMPORAL_ADDRESS", "nowhere.invalid:1")
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "someone-elses")
    env = await start_dev_server()
    try:
        described = await env.client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace="default")
        )
        assert described.namespace_info.name == "default"
        output = env.output
        assert output.is_file()
    finally:
        await env.shutdown()
    with pytest.raises(ProcessLookupError):
        os.kill(env.pid, 0)
    assert not output.exists()


async def test_a_server_that_cannot_start_says_why_at_once() -> None:
    # The control: the caller's OTEL_TRACES_EXPORTER handed to the server stops it, as it
    # did when the server inherited the environment. The error is the server's own words.
    started = time.monotonic()
    with pytest.raises(ConfigurationError) as caught:
        await start_dev_server(env={**server_environment(), "OTEL_TRACES_EXPORTER": "console"})
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert "did not start: it exited with status" in message
    assert "unsupported OTEL exporter: OTEL_TRACES_EXPORTER=console" in message
    assert elapsed < 30, "a server that exits is reported at once, not after the timeout"
    log = Path(message.rsplit("(its whole output: ", 1)[1].rstrip(")"))
    assert "unsupported OTEL exporter" in await asyncio.to_thread(log.read_text)
    await asyncio.to_thread(log.unlink)


async def test_a_server_that_never_answers_fails_after_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in binary that runs but never serves: the timeout, not a hang.
    fake = tmp_path / "temporal"
    fake.write_text("#!/bin/sh\necho 'still warming up'\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setattr(embedded, "find_binary", lambda name: str(fake))
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match=r"did not answer within 1\.5s") as caught:
        await start_dev_server(startup_timeout_s=1.5)
    assert time.monotonic() - started < 20
    assert "still warming up" in str(caught.value)


def test_demo_runs_with_otel_set_and_its_spans_go_to_stderr(tmp_path: Path) -> None:
    done = run_cli(
        ["demo", "--json"],
        tmp_path,
        timeout=240,
        OTEL_TRACES_EXPORTER="console",
        OTEL_METRICS_EXPORTER="none",
        TOOLTRAIL_OTEL_ENABLED="true",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)  # stdout is the JSON document and nothing else
    assert data["agent"]["stopped_by"] == "answer"
    # The console exporter wrote the tools' spans to stderr, named after the tools.
    assert '"name": "execute_tool calculate"' in done.stderr
    assert '"gen_ai.tool.name": "calculate"' in done.stderr
    assert '"name": "chat' in done.stderr
