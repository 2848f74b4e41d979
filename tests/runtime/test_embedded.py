"""The embedded dev server runs in an environment of its own, and says why when it cannot start."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.testing import WorkflowEnvironment

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


# -- a port taken before the server binds it ---------------------------------------------------


@contextlib.contextmanager
def held_ports(count: int) -> Iterator[list[int]]:
    """``count`` ports, each held by a listening socket of this process (another process's
    port, as far as the server can tell) until the block ends."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen()
            sockets.append(sock)
        yield [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


async def test_a_port_taken_before_the_server_binds_it_is_picked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The race of a fresh clone's `make test`: the port was free when it was picked, and
    # another process took it before the server bound it. Only the picking is replaced:
    # it hands out a port this test holds, then free ones again.
    with held_ports(1) as [taken]:
        picks = iter([taken])
        free_port = embedded._free_port
        monkeypatch.setattr(embedded, "_free_port", lambda: next(picks, None) or free_port())
        env = await start_dev_server()
        try:
            target = env.client.service_client.config.target_host
            assert target != f"127.0.0.1:{taken}"
            described = await env.client.workflow_service.describe_namespace(
                DescribeNamespaceRequest(namespace="default")
            )
            assert described.namespace_info.name == "default"
        finally:
            await env.shutdown()


async def test_a_port_taken_by_another_temporal_server_is_not_mistaken_for_ours(
    temporal_env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same race between two embedded servers (two test workers of `make test`): the one
    # that lost the port must not take the winner's answers for its own, hand out a client
    # of the other server and leave its caller with a server that is gone.
    theirs = temporal_env.client.service_client.config.target_host
    picks = iter([int(theirs.rsplit(":", 1)[1])])
    free_port = embedded._free_port
    monkeypatch.setattr(embedded, "_free_port", lambda: next(picks, None) or free_port())
    env = await start_dev_server()
    try:
        assert env.client.service_client.config.target_host != theirs
        assert env._process.returncode is None
    finally:
        await env.shutdown()


async def test_a_server_whose_ports_are_always_taken_says_which_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with held_ports(embedded._PORT_ATTEMPTS) as ports:
        picks = iter(ports)
        monkeypatch.setattr(embedded, "_free_port", lambda: next(picks))
        started = time.monotonic()
        with pytest.raises(ConfigurationError) as caught:
            await start_dev_server()
    assert time.monotonic() - started < 60
    message = str(caught.value)
    assert "\n" not in message and "goroutine" not in message
    assert f"port {ports[-1]} is already in use (5 sets of free ports tried" in message
    await asyncio.to_thread(Path(message.rsplit("its whole output: ", 1)[1].rstrip(")")).unlink)


async def test_a_port_asked_for_and_in_use_is_not_swapped_for_another() -> None:
    with held_ports(1) as [taken], pytest.raises(ConfigurationError) as caught:
        await start_dev_server(port=taken)
    message = str(caught.value)
    assert f"port {taken} is already in use (the port was asked for" in message
    assert "\n" not in message
    await asyncio.to_thread(Path(message.rsplit("its whole output: ", 1)[1].rstrip(")")).unlink)


PANIC = "\n".join(
    [
        'time=2026-12-05T17:03:19.960 level=ERROR msg="Failed to start gRPC listener" '
        'error="listen tcp 127.0.0.1:$PORT: bind: address already in use" service=frontend '
        "address=127.0.0.1:$PORT",
        "panic: runtime error: invalid memory address or nil pointer dereference",
        "[signal SIGSEGV: segmentation violation code=0x1 addr=0x20 pc=0x2bb0889]",
        "",
        "goroutine 1 [running]:",
        "go.temporal.io/server/service/frontend.NewHTTPAPIServer(0x19da68b12008, ...)",
        "\t/home/runner/go/pkg/mod/go.temporal.io/server@v1.32.0/service/frontend/"
        "http_api_server.go:83 +0x89",
        "main.main()",
        "\t/home/runner/work/cli/cli/cmd/temporal/main.go:18 +0x8e",
        "",
    ]
)


async def test_the_go_panic_of_a_port_lost_late_is_read_as_its_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Taken after the server's own check of the port, the port makes the Go server panic
    # (the lines above are what temporal 1.9.1 printed then): a stand-in binary that always
    # loses its port that way. It is started again on fresh ports, and the error is one line.
    starts = tmp_path / "starts"
    fake = tmp_path / "temporal"
    fake.write_text(
        "#!/bin/sh\n"
        'while [ $# -gt 0 ]; do [ "$1" = --port ] && PORT=$2; shift; done\n'
        f"echo start >> {starts}\n"
        f"cat <<EOF\n{PANIC}EOF\n"
        "exit 2\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(embedded, "find_binary", lambda name: str(fake))
    with pytest.raises(ConfigurationError) as caught:
        await start_dev_server()
    message = str(caught.value)
    assert len(starts.read_text().split()) == embedded._PORT_ATTEMPTS
    assert "\n" not in message and "goroutine" not in message and "panic" not in message
    assert "is already in use (5 sets of free ports tried" in message
    await asyncio.to_thread(Path(message.rsplit("its whole output: ", 1)[1].rstrip(")")).unlink)


def test_a_panic_that_is_not_about_a_port_shows_its_error_lines_not_its_goroutines(
    tmp_path: Path,
) -> None:
    output = tmp_path / "out.log"
    output.write_text(PANIC.replace("bind: address already in use", "no route to host"))
    said = embedded._tail(output)
    assert said.splitlines() == [
        PANIC.splitlines()[0].replace("bind: address already in use", "no route to host"),
        "panic: runtime error: invalid memory address or nil pointer dereference",
    ]
