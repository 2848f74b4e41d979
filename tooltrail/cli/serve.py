"""The commands that run things: ``demo``, ``run``, ``dev``, ``worker`` and ``codec-server``.

With what they share: waiting for Ctrl-C (or a dead worker) and OpenTelemetry while a worker
runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Awaitable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.text import Text

from tooltrail.cli._shared import (
    app,
    console,
    errors,
    fail,
    load_host,
    resolve_database_url,
    run_command,
    shown_url,
)
from tooltrail.cli.options import (
    DatabaseOption,
    JsonOption,
    NamespaceOption,
    TaskQueueOption,
    ToolsOption,
)
from tooltrail.cli.render import (
    escape,
    preview,
    print_json,
    print_table,
    results_table,
    timeline_table,
)
from tooltrail.errors import TooltrailError
from tooltrail.settings import Settings

__all__ = ["codec_server", "demo", "dev", "run_agent_command", "worker"]

T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _until_stopped(running: Any = None) -> None:
    """Wait for SIGINT/SIGTERM; with a Temporal ``Worker``, also stop when it dies.

    Raises:
        TooltrailError: the worker stopped by itself (so a supervisor restarts the process).
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        if running is not None and not running.is_running and not stop.is_set():
            raise TooltrailError("the Temporal worker stopped unexpectedly; see the log above")


def _run_with_telemetry(coro: Awaitable[T]) -> T:
    """``_run`` for commands that run a worker: OpenTelemetry from ``OTEL_*`` while it runs.

    The providers are shut down (flushed) before the command exits: ``main`` leaves with
    ``os._exit``, so the SDK's own exit hook would never run.
    """
    from tooltrail.telemetry import ensure_configured

    telemetry = ensure_configured()
    try:
        return run_command(coro)
    finally:
        if telemetry is not None:
            telemetry.shutdown()


@app.command()
def demo(
    database_url: DatabaseOption = None,
    keep_open: Annotated[
        bool, typer.Option("--keep-open", help="Keep the server and UI up until Ctrl-C.")
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """Run a scripted agent turn on the embedded Temporal server and show its audit trail."""
    import uuid

    import tooltrail
    from tooltrail.cli.demo import SCRIPTED_TURN, host, scripted_agent_model
    from tooltrail.pipeline.host import Host

    url = resolve_database_url(database_url)
    agent_host = Host(host.registry, model=scripted_agent_model())

    async def go() -> None:
        ui_port = _free_port()
        if not json_output:
            console.print("[bold]Starting the embedded Temporal dev server and a worker...[/]")
        async with tooltrail.local(agent_host, database_url=url, ui=True, ui_port=ui_port) as tt:
            # Fresh sessions: the demo's database persists, and a session's loop window with
            # it; the same scripted calls in one session would be stopped from the 11th run.
            suffix = uuid.uuid4().hex[:8]
            turn = await tt.run_turn(SCRIPTED_TURN, session_id=f"demo-{suffix}")
            events = await tt.audit(turn.turn_id)
            run = await tt.run_agent(
                "Note a fact, do some arithmetic, check the weather, then sum it up.",
                session_id=f"demo-agent-{suffix}",
                system="You are a careful assistant.",
            )
            conversation = await tt.conversation(run.run_id)
            if json_output:
                print_json(
                    console,
                    {
                        "turn_id": turn.turn_id,
                        "results": [r.model_dump(mode="json") for r in turn.results],
                        "audit": [e.model_dump(mode="json") for e in events],
                        "agent": run.model_dump(mode="json"),
                        "conversation": [m.model_dump(mode="json") for m in conversation],
                    },
                )
                return
            console.print(
                f"\nTurn [bold]{escape(turn.turn_id)}[/] ran {len(turn.results)} calls.\n"
            )
            print_table(console, results_table(turn.results))
            console.print()
            print_table(console, timeline_table(events))
            console.print(
                f"\n[bold]A scripted agent run[/] ({run.run_id}): {len(run.turns)} model turns, "
                f"{run.usage.input_tokens + run.usage.output_tokens} tokens"
            )
            for message in conversation:
                calls = ", ".join(f"{c.name}({c.arguments})" for c in message.tool_calls)
                text = preview(message.content or calls, 110)
                # The model's words, never markup.
                console.print(f"  [cyan]{message.role:>9}[/]  {escape(text)}", highlight=False)
            console.print(
                f"Each turn's audit trail: tooltrail audit show {run.turns[0]}", soft_wrap=True
            )
            shown = shown_url(url)
            console.print(
                f"\nAudit database: {shown}\n"
                f"Temporal UI: http://127.0.0.1:{ui_port}/namespaces/default/workflows/"
                f"{turn.turn_id}\n"
                f"Show this turn again: tooltrail audit show {turn.turn_id} --database-url {shown}",
                soft_wrap=True,
                highlight=False,
            )
            if keep_open:
                console.print("The server and UI stay up; press Ctrl-C to stop.")
                await _until_stopped()
            else:
                console.print("(the embedded server stops now; add --keep-open to browse the UI)")

    _run_with_telemetry(go())


@app.command("run")
def run_agent_command(
    prompt: Annotated[str, typer.Argument(help="What to ask the agent.")],
    tools: ToolsOption = "tooltrail.cli.demo:host",
    provider: Annotated[
        str, typer.Option(help="openai (any OpenAI-compatible server) or anthropic.")
    ] = "openai",
    model: Annotated[str | None, typer.Option(envvar="TOOLTRAIL_MODEL")] = None,
    system: Annotated[str | None, typer.Option(help="A system prompt.")] = None,
    max_turns: Annotated[int, typer.Option(help="Stop after this many model turns.")] = 10,
    session: Annotated[str | None, typer.Option(help="Session id (default: a new one).")] = None,
    local_model: Annotated[
        bool,
        typer.Option(
            "--local-model",
            help="Ask the model in a local activity: faster, for fast models (see start_agent).",
        ),
    ] = False,
    temporal_address: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT of a Temporal cluster whose workers run the agent (their model "
            "client answers; --provider is not used). Default: the embedded stack."
        ),
    ] = None,
    task_queue: Annotated[
        str | None,
        typer.Option(envvar="TOOLTRAIL_TASK_QUEUE", help="The workers' task queue (cluster)."),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(envvar="TOOLTRAIL_NAMESPACE", help="Temporal namespace (cluster)."),
    ] = None,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach", help="Print the run id once it has started and return (cluster only)."
        ),
    ] = False,
    database_url: DatabaseOption = None,
    json_output: JsonOption = False,
) -> None:
    """Run a durable agent, on the embedded stack or (--temporal-address) a cluster's workers.

    On the embedded stack the model's endpoint and key come from the settings; on a cluster
    the workers' model client answers, and --detach returns once the run has started.
    """
    import uuid

    import tooltrail
    from tooltrail.llm import build_model_client
    from tooltrail.pipeline.host import Host

    session_id = session or f"cli-{uuid.uuid4().hex[:8]}"
    if temporal_address is not None:
        from tooltrail.cli.agent_runs import run_on_cluster

        run_on_cluster(
            prompt,
            temporal_address=temporal_address,
            namespace=namespace,
            task_queue=task_queue,
            database_url=database_url,
            session_id=session_id,
            model=model,
            system=system,
            max_turns=max_turns,
            local_model=local_model,
            detach=detach,
            json_output=json_output,
        )
        return
    if detach:
        # The embedded server stops with this command, and the run with it.
        raise fail("--detach needs --temporal-address: the embedded server stops with the command")
    wired = load_host(tools)
    client = build_model_client(provider, model=model)  # type: ignore[arg-type]
    host = Host(
        wired.registry,
        hooks=wired.hooks,
        observers=wired.observers,
        middleware=wired.middleware,
        reflector=wired.reflector,
        circuit_breaker=wired.circuit_breaker,
        access=wired.access,
        model=client,
    )

    async def go() -> Any:
        async with tooltrail.local(host, database_url=resolve_database_url(database_url)) as tt:
            result = await tt.run_agent(
                prompt,
                session_id=session_id,
                system=system,
                max_turns=max_turns,
                local_model=local_model,
            )
            return result

    result = _run_with_telemetry(go())
    if json_output:
        print_json(console, result.model_dump(mode="json"))
    else:
        console.print(result.text or f"(no answer: stopped by {result.stopped_by})")
        errors.print(f"run {result.run_id}: {len(result.turns)} turns", soft_wrap=True)


@app.command()
def dev(
    tools: ToolsOption = "tooltrail.cli.demo:host",
    port: Annotated[int, typer.Option(help="Temporal frontend port.")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Temporal UI port.")] = 8233,
    task_queue: Annotated[str, typer.Option(envvar="TOOLTRAIL_TASK_QUEUE")] = "tooltrail",
    database_url: DatabaseOption = None,
    persist: Annotated[
        bool, typer.Option(help="Keep the Temporal server's state in the data directory.")
    ] = True,
    no_worker: Annotated[
        bool,
        typer.Option(
            "--no-worker",
            help="Run no worker here (start `tooltrail worker` on the task queue yourself).",
        ),
    ] = False,
) -> None:
    """Run the embedded Temporal server, its UI and a worker for local development."""
    import tooltrail

    host = load_host(tools)
    settings = Settings()
    url = database_url or settings.effective_database_url()
    server_db = None
    if persist:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        server_db = str(settings.data_dir / "temporal.db")

    async def go() -> None:
        async with tooltrail.local(
            host,
            database_url=url,
            task_queue=task_queue,
            ui=True,
            port=port,
            ui_port=ui_port,
            server_db_filename=server_db,
            worker=not no_worker,
        ):
            served = (
                "none here (--no-worker): run `tooltrail worker --tools MODULE:ATTR "
                f"--temporal-address 127.0.0.1:{port} --task-queue {task_queue}`"
                if no_worker
                else ", ".join(host.registry.names())
            )
            console.print(
                f"Temporal: 127.0.0.1:{port}   UI: http://127.0.0.1:{ui_port}\n"
                f"Task queue: {task_queue}   Tools: {served}\n"
                f"Audit database: {shown_url(url)}\nPress Ctrl-C to stop.",
                highlight=False,
            )
            await _until_stopped()

    _run_with_telemetry(go())


def _capacity_option(name: str, help_text: str) -> Any:
    return typer.Option(
        f"--{name.replace('_', '-')}", envvar=f"TOOLTRAIL_{name.upper()}", help=help_text
    )


@app.command()
def worker(
    tools: ToolsOption,
    temporal_address: Annotated[
        str | None, typer.Option(envvar="TOOLTRAIL_TEMPORAL_ADDRESS", help="HOST:PORT")
    ] = None,
    namespace: NamespaceOption = None,
    task_queue: TaskQueueOption = None,
    database_url: DatabaseOption = None,
    mcp: Annotated[
        list[str] | None,
        typer.Option(
            "--mcp",
            help='An MCP server to start, "PREFIX=COMMAND ARGS" (repeatable); its tools '
            "register as PREFIX_name. Default: TOOLTRAIL_MCP_SERVERS.",
        ),
    ] = None,
    mcp_url: Annotated[
        list[str] | None,
        typer.Option("--mcp-url", help='A streamable HTTP MCP server, "PREFIX=URL" (repeatable).'),
    ] = None,
    max_concurrent_activities: Annotated[
        int | None,
        _capacity_option("max_concurrent_activities", "Tool attempts run at once (100)."),
    ] = None,
    max_concurrent_workflow_tasks: Annotated[
        int | None,
        _capacity_option("max_concurrent_workflow_tasks", "Workflow tasks run at once (100)."),
    ] = None,
    max_concurrent_local_activities: Annotated[
        int | None,
        _capacity_option(
            "max_concurrent_local_activities", "Local activities (audit writes) at once (100)."
        ),
    ] = None,
    max_cached_workflows: Annotated[
        int | None,
        _capacity_option("max_cached_workflows", "Workflows kept in memory (1000)."),
    ] = None,
    db_pool_size: Annotated[
        int | None, _capacity_option("db_pool_size", "Database connections kept open (5).")
    ] = None,
    db_max_overflow: Annotated[
        int | None,
        _capacity_option("db_max_overflow", "Connections beyond the pool under load (10)."),
    ] = None,
    deployment: Annotated[
        str | None,
        typer.Option(
            "--deployment",
            envvar="TOOLTRAIL_WORKER_DEPLOYMENT",
            help="Temporal worker deployment to poll as (with --build-id); manual: Upgrading.",
        ),
    ] = None,
    build_id: Annotated[
        str | None,
        typer.Option(
            "--build-id", envvar="TOOLTRAIL_WORKER_BUILD_ID", help="This release's build id."
        ),
    ] = None,
    set_current: Annotated[
        bool,
        typer.Option(
            "--set-current", help="Make this version current once it polls (new turns go to it)."
        ),
    ] = False,
) -> None:
    """Run a worker against an existing Temporal cluster (until SIGINT or SIGTERM).

    Sizing: see docs/operations/sizing.md; every flag also reads its TOOLTRAIL_ variable.
    """
    import tooltrail
    from tooltrail.tools.mcp import McpServerSpec, open_mcp_servers

    host = load_host(tools)
    settings = Settings()
    specs = [McpServerSpec.parse(text, url=False) for text in mcp or []]
    specs += [McpServerSpec.parse(text, url=True) for text in mcp_url or []]
    if mcp is None and mcp_url is None:
        specs = [McpServerSpec.parse(text) for text in settings.mcp_servers]
    capacity: dict[str, Any] = {
        name: value
        for name, value in {
            "max_concurrent_activities": max_concurrent_activities,
            "max_concurrent_workflow_tasks": max_concurrent_workflow_tasks,
            "max_concurrent_local_activities": max_concurrent_local_activities,
            "max_cached_workflows": max_cached_workflows,
        }.items()
        if value is not None
    }
    pool = {
        name: value
        for name, value in {"pool_size": db_pool_size, "max_overflow": db_max_overflow}.items()
        if value is not None
    }
    from tooltrail.runtime.versioning import deployment_config, set_current_version

    versioning = deployment_config(
        deployment or settings.worker_deployment, build_id or settings.worker_build_id
    )
    if set_current and versioning is None:
        raise fail("--set-current needs --deployment and --build-id")

    async def go() -> None:
        async with (
            open_mcp_servers(host.registry, specs) as toolsets,
            tooltrail.worker(
                host,
                temporal_address=temporal_address,
                namespace=namespace,
                task_queue=task_queue,
                database_url=database_url,
                engine_options=pool,
                deployment_config=versioning,
                **capacity,
            ) as running,
        ):
            if set_current and versioning is not None:
                await set_current_version(
                    running.client,
                    versioning.version.deployment_name,
                    versioning.version.build_id,
                )
            mcp_tools = sorted(name for toolset in toolsets for name in toolset.tools)
            errors.print(
                Text(
                    f"worker up: {temporal_address or settings.temporal_address}, "
                    f"task queue {task_queue or settings.task_queue}, "
                    f"tools {', '.join(host.registry.names())}"
                    + (f" (from MCP: {', '.join(mcp_tools)})" if mcp_tools else "")
                    + (
                        f", version {versioning.version.deployment_name}/"
                        f"{versioning.version.build_id}" + (" (current)" if set_current else "")
                        if versioning is not None
                        else ""
                    )
                ),
                soft_wrap=True,
            )
            await _until_stopped(running)

    _run_with_telemetry(go())


@app.command("codec-server")
def codec_server(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8081,
    origin: Annotated[
        list[str] | None,
        typer.Option(
            "--origin",
            help="Browser origin (the Temporal UI's) allowed to call it; repeatable "
            "(default: TOOLTRAIL_CODEC_SERVER_ORIGINS).",
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(help="PEM certificate: serve HTTPS (with --tls-key).")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="PEM private key of --tls-cert.")] = None,
) -> None:
    """Decode encrypted payloads for the Temporal UI and CLI (Temporal's remote codec).

    Needs TOOLTRAIL_CODEC_KEYS and a bearer token, TOOLTRAIL_CODEC_SERVER_TOKEN (never a
    command-line option: a process's arguments are visible to every user of the machine).
    """
    from tooltrail.ops.codec_server import serve

    run_command(
        serve(Settings(), host=host, port=port, origins=origin, tls_cert=tls_cert, tls_key=tls_key)
    )
