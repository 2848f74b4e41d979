"""The ``tooltrail`` command line: demo, dev, worker, audit, db.

Every command has ``--help``; the reading commands take ``--json`` for machines.

Contracts for scripts and CI (docs/operations/cli.md):

- with ``--json``, stdout holds the JSON document and nothing else: the process's file
  descriptor 1 is pointed at stderr for the whole command (so the embedded server's banner,
  a tool's ``print`` and anything a library writes go there) and the JSON is written to a
  saved copy of the original stdout; the Temporal core's log lines go through Python
  logging (tooltrail's formatter and secret filter, on stderr);
- exit codes: 0 done, 1 an error (one line on stderr saying what is wrong and what to do, no
  traceback), 2 a usage error, 3 a check found something (``rerun`` with differences,
  ``audit list --stuck`` with stuck turns, ``db current`` behind the code's head); except
  ``audit verify`` (issue 18): 1 the trail and Temporal's history disagree, 2 a turn could
  not be checked;
- ids are shown whole, and whatever a model or caller chose is never read as markup
  (``tooltrail.cli.render``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.text import Text
from temporalio.service import RPCError, RPCStatusCode

from tooltrail.cli._shared import (
    EXIT_ERROR,
    CommandError,
    console,
    error_line,
    errors,
    fail,
    resolve_database_url,
    rpc_error_text,
    run_command,
    shown_url,
    with_store,
)
from tooltrail.cli.config import config_app
from tooltrail.cli.options import (
    AddressOption,
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
    send_json_to,
    timeline_table,
    turns_table,
)
from tooltrail.errors import ConfigurationError, TooltrailError
from tooltrail.pipeline.host import Host
from tooltrail.settings import Settings
from tooltrail.tools import Tool, ToolRegistry

__all__ = ["EXIT_ERROR", "EXIT_FOUND", "app", "load_host", "main"]

EXIT_FOUND = 3
"""Exit status of a check that found something (differences, stuck turns, a database behind)."""

app = typer.Typer(
    help="tooltrail: durable, auditable tool calls for LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
audit_app = typer.Typer(help="Read the audit trail.", no_args_is_help=True)
db_app = typer.Typer(help="Manage the audit database.", no_args_is_help=True)
history_app = typer.Typer(help="Export workflow histories.", no_args_is_help=True)
app.add_typer(audit_app, name="audit")
app.add_typer(db_app, name="db")
app.add_typer(history_app, name="history")
app.add_typer(config_app, name="config")
approvers_app = typer.Typer(help="Approvers who sign approvals.", no_args_is_help=True)
app.add_typer(approvers_app, name="approvers")

T = TypeVar("T")


def load_host(spec: str) -> Host:
    """Import ``MODULE:ATTR`` and return it as a ``Host``.

    Raises:
        ConfigurationError: the path cannot be imported or names something else.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"--tools {spec!r} must look like MODULE:ATTR")
    # Tools modules usually live in the directory the command runs from.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r} for --tools: {exc}") from exc
    try:
        value = getattr(module, attr)
    except AttributeError as exc:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from exc
    if isinstance(value, Host):
        return value
    if isinstance(value, ToolRegistry):
        return Host(value)
    if isinstance(value, Tool):
        return Host([value])
    if isinstance(value, list | tuple) and all(isinstance(item, Tool) for item in value):
        return Host(value)
    raise ConfigurationError(
        f"{spec!r} is a {type(value).__name__}; expected a Host, a ToolRegistry or a list of tools"
    )


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


def _parse_time(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise typer.BadParameter(f"{value!r} is not an ISO date or time") from exc
    return parsed if parsed.tzinfo else parsed.astimezone()


@audit_app.command("list")
def audit_list(
    session: Annotated[str | None, typer.Option(help="Only this session.")] = None,
    status: Annotated[
        str | None,
        typer.Option(help="completed, failed, cancelled, terminated, timed_out or running."),
    ] = None,
    tool: Annotated[str | None, typer.Option(help="Only turns that called this tool.")] = None,
    since: Annotated[str | None, typer.Option(help="Started at or after (ISO time).")] = None,
    until: Annotated[str | None, typer.Option(help="Started before (ISO time).")] = None,
    errors_only: Annotated[
        bool, typer.Option("--errors", help="Only turns with soft or hard errors.")
    ] = False,
    limit: Annotated[int, typer.Option(help="At most this many turns.")] = 50,
    stuck: Annotated[
        bool,
        typer.Option(
            "--stuck", help="Turns whose workflow task keeps failing (asks the Temporal server)."
        ),
    ] = False,
    temporal_address: AddressOption = None,
    database_url: DatabaseOption = None,
    json_output: JsonOption = False,
) -> None:
    """List recent turns, newest first."""
    if stuck:
        _list_stuck(temporal_address, limit, json_output)
        return
    filters = {
        "session_id": session,
        "status": status,
        "tool": tool,
        "since": _parse_time(since),
        "until": _parse_time(until),
        "errors_only": errors_only,
        "limit": limit,
    }
    turns = run_command(
        with_store(resolve_database_url(database_url), lambda store: store.turns(**filters))
    )
    if json_output:
        print_json(console, [turn.model_dump(mode="json") for turn in turns])
    elif not turns:
        console.print("no turns match")
    else:
        print_table(console, turns_table(turns))


def _list_stuck(temporal_address: str | None, limit: int, json_output: bool) -> None:
    from tooltrail.client import Tooltrail

    async def go() -> list[Any]:
        client = await _client(temporal_address)
        tt = Tooltrail(client, Host(), task_queue="", store=None)  # type: ignore[arg-type]
        found: list[Any] = await tt.stuck_turns(limit=limit)
        return found

    found = run_command(go())
    if json_output:
        print_json(console, [s.model_dump(mode="json") for s in found])
    elif not found:
        console.print("no stuck turns")
    for item in [] if json_output else found:
        console.print(
            Text("stuck ", style="red")
            + Text(
                f"{item.turn_id}: workflow task attempt {item.attempts} "
                f"(started {item.started_at:%Y-%m-%d %H:%M:%S})"
            ),
            soft_wrap=True,
        )
    if found:
        raise typer.Exit(EXIT_FOUND)  # a gate fails on stuck turns


@audit_app.command("show")
def audit_show(
    turn_id: Annotated[str, typer.Argument(help="The turn id, or an agent run's id.")],
    full: Annotated[bool, typer.Option("--full", help="Show complete inputs and outputs.")] = False,
    all_runs: Annotated[
        bool,
        typer.Option("--all-runs", help="Every Temporal run's records (a reset makes a new run)."),
    ] = False,
    database_url: DatabaseOption = None,
    json_output: JsonOption = False,
) -> None:
    """Show one turn's audit trail (its latest Temporal run, or every run), or a run's turns."""
    from tooltrail.cli.agent_runs import show_run

    async def read(store: Any) -> tuple[Any, list[Any], list[Any]]:
        return (
            await store.turn(turn_id),
            await store.events(turn_id, all_runs=True),
            await store.runs(turn_id),
        )

    turn, every, runs = run_command(with_store(resolve_database_url(database_url), read))
    if turn is None and not every:
        if show_run(turn_id, database_url=database_url, full=full, json_output=json_output):
            return
        raise fail(
            f"no turn {turn_id!r} in the audit database, nor an agent run of that id; "
            "`tooltrail audit list` shows recent turns (and --database-url picks the database)"
        )
    by_run: dict[str, list[Any]] = {}
    for event in every:
        by_run.setdefault(event.run_id or "", []).append(event)
    latest = "" if turn is None else turn.run_id
    shown = [r for r in runs if all_runs or r.run_id == latest]
    if json_output:
        print_json(
            console,
            {
                "turn": None if turn is None else turn.model_dump(mode="json"),
                "runs": [_run_json(run, by_run) for run in shown],
                "events": [
                    e.model_dump(mode="json") for run in shown for e in by_run.get(run.run_id, [])
                ],
            },
        )
        return
    if turn is not None:
        console.print(
            Text("turn ")
            + Text(turn.turn_id, style="bold")
            + Text(f"  session {turn.session_id}  status {turn.status}")
            + Text(f"  error: {turn.error}" if turn.error else ""),
            soft_wrap=True,
        )
    for run in shown or [None]:
        events = by_run.get(latest if run is None else run.run_id, [])
        if run is not None and (len(runs) > 1 or run.run_id):
            console.print(_run_line(run, by_run), soft_wrap=True)
        print_table(console, timeline_table(events, full=full))
        _print_lost_attempts(events)
        end = next((e for e in reversed(events) if e.kind == "turn_end"), None)
        if end is not None and end.payload.get("results"):
            from tooltrail.core.results import ToolDispatchResult

            results = [ToolDispatchResult.model_validate(r) for r in end.payload["results"]]
            print_table(console, results_table(results, title="Results returned to the model"))


def _branch(run: Any, by_run: dict[str, list[Any]]) -> int | None:
    from tooltrail.core.branches import branch_point

    if run.branched_from is None:
        return None
    return branch_point(by_run.get(run.branched_from, []), by_run.get(run.run_id, []))


def _run_json(run: Any, by_run: dict[str, list[Any]]) -> dict[str, Any]:
    return {**run.model_dump(mode="json"), "branch_seq": _branch(run, by_run)}


def _run_line(run: Any, by_run: dict[str, list[Any]]) -> Text:
    line = Text("run ") + Text(run.run_id or "(no run id)", style="bold")
    line += Text(" (latest)" if run.latest else " (earlier run)")
    seq = _branch(run, by_run)
    if seq is not None:
        line += Text(
            f"  branched from run {run.branched_from} at seq {seq}: "
            f"records before seq {seq} are the same in both runs"
        )
    return line


def _print_lost_attempts(events: list[Any]) -> None:
    """Say which Temporal attempts of a call were lost with their workers."""
    for event in events:
        lost = event.payload.get("lost_attempts") if event.kind == "tool_post" else None
        if not lost:
            continue
        for item in lost:
            console.print(
                Text("lost ", style="red")
                + Text(
                    f"call {event.tool_call_id} attempt {event.attempt}: Temporal attempt "
                    f"{item.get('temporal_attempt')} on worker {item.get('worker') or 'unknown'} "
                    f"was lost; attempt {event.temporal_attempt} on {event.worker} completed it"
                ),
                soft_wrap=True,
            )


@audit_app.command("reconcile")
def audit_reconcile(
    since: Annotated[
        str | None, typer.Option(help="Only turns started at or after (ISO time).")
    ] = None,
    temporal_address: AddressOption = None,
    database_url: DatabaseOption = None,
    json_output: JsonOption = False,
) -> None:
    """Give turns that ended outside tooltrail (terminated, timed out, ...) their true status."""
    from tooltrail.runtime.reconciler import reconcile

    started_since = _parse_time(since)

    async def go(store: Any) -> Any:
        return await reconcile(await _client(temporal_address), store, since=started_since)

    report = run_command(with_store(resolve_database_url(database_url), go))
    if json_output:
        print_json(console, report.model_dump(mode="json"))
        return
    console.print(
        Text(
            f"{report.checked} running turns checked: {len(report.changed)} reconciled, "
            f"{report.still_running} running in Temporal too, "
            f"{len(report.missing)} unknown to Temporal"
        ),
        soft_wrap=True,
    )
    for item in report.changed:
        console.print(
            Text(f"{item.turn_id}: running -> ")
            + Text(str(item.status), style="bold")
            + Text(f" ({item.detail})" if item.detail else ""),
            soft_wrap=True,
        )
    for item in report.missing:
        console.print(
            Text(f"{item.turn_id}: ")
            + Text("unknown to Temporal", style="yellow")
            + Text(f" ({item.detail}); its row is left running"),
            soft_wrap=True,
        )


EXIT_MISMATCH = 1
"""``audit verify``: the trail and Temporal's history disagree."""
EXIT_CANNOT_CHECK = 2
"""``audit verify``: a turn could not be checked (unknown turn, history gone, no keys)."""


@audit_app.command("verify")
def audit_verify(
    turn_id: Annotated[str | None, typer.Argument(help="The turn to verify.")] = None,
    session: Annotated[str | None, typer.Option(help="Every turn of this session.")] = None,
    since: Annotated[
        str | None, typer.Option(help="Every turn started at or after (ISO time).")
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many turns.")] = 1000,
    temporal_address: AddressOption = None,
    database_url: DatabaseOption = None,
    json_output: JsonOption = False,
) -> None:
    """Check turns' trails against Temporal's histories; exit 1 on a mismatch, 2 unchecked."""
    from tooltrail.ops.verify import verify_turn, verify_turns

    if (turn_id is None) == (session is None and since is None):
        raise typer.BadParameter("give a TURN, or --session S and/or --since T")
    started_since = _parse_time(since)

    async def go(store: Any) -> list[Any]:
        client = await _client(temporal_address)
        # Signed approvals are re-checked against the approvers configured in the settings.
        approvers = Settings().approver_keys()
        if turn_id is not None:
            return [await verify_turn(client, store, turn_id, approvers=approvers)]
        return await verify_turns(
            client,
            store,
            session_id=session,
            since=started_since,
            limit=limit,
            approvers=approvers,
        )

    try:
        reports = run_command(with_store(resolve_database_url(database_url), go))
    except typer.Exit as failed:
        # An error (Temporal unreachable, a database behind): nothing was checked, and 1
        # would read as a mismatch here.
        raise typer.Exit(EXIT_CANNOT_CHECK) from failed
    mismatch = any(not r.ok and r.checkable for r in reports)
    unchecked = not reports or any(not r.checkable for r in reports)
    if json_output:
        print_json(console, [report.model_dump(mode="json") for report in reports])
    elif not reports:
        error_line("no turns match: nothing to verify (`tooltrail audit list` shows turns)")
    for report in [] if json_output else reports:
        mark = (
            Text("ok      ", style="green")
            if report.ok
            else Text("MISMATCH", style="red")
            if report.checkable
            else Text("UNCHECKED", style="yellow")
        )
        console.print(
            mark
            + Text(
                f" {report.turn_id}: {report.attempts_checked} tool attempts checked, "
                f"trail {report.trail_status}, Temporal {report.temporal_status}"
                + (
                    f", chain anchored in its {report.anchor}"
                    if report.anchor
                    else ", chain not anchored"
                    if report.checkable
                    else ""
                )
            ),
            soft_wrap=True,
        )
        for problem in report.problems:
            console.print(Text(f"  {problem.kind}: {problem.detail}"), soft_wrap=True)
    if mismatch:
        raise typer.Exit(EXIT_MISMATCH)
    if unchecked:
        raise typer.Exit(EXIT_CANNOT_CHECK)


def _client_options() -> tuple[str, str]:
    settings = Settings()
    return settings.temporal_address, settings.namespace


async def _turn_handle(turn_id: str, temporal_address: str | None, store: Any = None) -> Any:
    from tooltrail.client import TurnHandle
    from tooltrail.core.wire import TurnOutput

    client = await _client(temporal_address)
    return TurnHandle(client.get_workflow_handle(turn_id, result_type=TurnOutput), store)


async def _running_turn(
    turn_id: str, temporal_address: str | None, call_id: str, store: Any = None
) -> Any:
    """The handle of a turn that is still running, or the one-line error that it is not.

    Raises:
        CommandError: no such turn, or it has ended (so nothing of it waits any more).
    """
    from temporalio.client import WorkflowExecutionStatus

    handle = await _turn_handle(turn_id, temporal_address, store)
    try:
        description = await handle.workflow_handle.describe()
    except RPCError as exc:
        raise CommandError(rpc_error_text(exc, f"turn {turn_id!r}")) from exc
    if description.status != WorkflowExecutionStatus.RUNNING:
        status = description.status.name.lower() if description.status else "closed"
        raise CommandError(
            f"turn {turn_id!r} has ended ({status}): call {call_id!r} is no longer waiting "
            "for approval"
        )
    return handle


async def _answer(
    turn_id: str,
    call_id: str,
    temporal_address: str | None,
    answer: Callable[[Any], Any],
    database_url: str | None = None,
) -> None:
    from tooltrail.db.migrate import open_store
    from tooltrail.db.store import AuditStore
    from tooltrail.errors import ApprovalRejected

    # The audit database records an answer the turn refuses (a refused Update leaves no
    # history); without a migrated one the refusal is still the command's answer.
    url = resolve_database_url(database_url)
    store: AuditStore | None = None
    with contextlib.suppress(Exception):
        store = await open_store(url)
    try:
        handle = await _running_turn(turn_id, temporal_address, call_id, store)
        await answer(handle)
    except RPCError as exc:
        # The turn ended between the check and the answer.
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        raise CommandError(
            f"turn {turn_id!r} has ended: call {call_id!r} is no longer waiting for approval"
        ) from exc
    except ApprovalRejected as exc:
        if not exc.reason.startswith("approval rejected:"):
            raise CommandError(
                f"{exc} in turn {turn_id!r}; `tooltrail approvals --all` lists what waits"
            ) from exc
        raise CommandError(f"{exc} (call {call_id!r} of turn {turn_id!r} keeps waiting)") from exc
    except ConfigurationError as exc:  # the turn runs, but this call does not wait
        raise CommandError(
            f"{exc} in turn {turn_id!r}; `tooltrail approvals --all` lists what waits"
        ) from exc
    finally:
        if store is not None:
            await store.close()


KeyOption = Annotated[
    Path | None,
    typer.Option(
        "--key",
        envvar="TOOLTRAIL_APPROVER_KEY",
        help="Sign with this Ed25519 private key (PEM); needed where approvers are configured.",
    ),
]
ExpiresOption = Annotated[
    float,
    typer.Option("--expires-in", min=1, help="Seconds the signed answer stays valid."),
]


def _approver(by: str | None, key: Path | None) -> str | None:
    """Who answers: ``--by``, else (signing) ``TOOLTRAIL_APPROVER_NAME``, else ``$USER``."""
    if by:
        return by
    if key is not None and Settings().approver_name:
        return Settings().approver_name
    return os.environ.get("USER")


@app.command()
def approve(
    turn_id: Annotated[str, typer.Argument(help="The turn id.")],
    call_id: Annotated[str, typer.Argument(help="The tool call id waiting for approval.")],
    by: Annotated[
        str | None,
        typer.Option(help="Who approves: a claim unsigned, the approver's name with --key."),
    ] = None,
    key: KeyOption = None,
    expires_in: ExpiresOption = 900,
    temporal_address: AddressOption = None,
    database_url: DatabaseOption = None,
) -> None:
    """Approve a call of an interactive turn that a hook parked with Ask.

    With --key the approval is signed for this turn, this call and the arguments it waits
    with; a turn whose workers have approvers configured accepts nothing else.
    """
    from datetime import timedelta

    who = _approver(by, key)
    validity = timedelta(seconds=expires_in)
    run_command(
        _answer(
            turn_id,
            call_id,
            temporal_address,
            lambda h: h.approve(call_id, by=who, key=key, expires_in=validity),
            database_url,
        )
    )
    signed = f" (signed by {who})" if key is not None else ""
    console.print(Text(f"approved {call_id} of {turn_id}{signed}"), soft_wrap=True)


@app.command()
def deny(
    turn_id: Annotated[str, typer.Argument(help="The turn id.")],
    call_id: Annotated[str, typer.Argument(help="The tool call id waiting for approval.")],
    reason: Annotated[str, typer.Option(help="Why (the model reads it).")],
    by: Annotated[
        str | None,
        typer.Option(help="Who denies: a claim unsigned, the approver's name with --key."),
    ] = None,
    key: KeyOption = None,
    expires_in: ExpiresOption = 900,
    temporal_address: AddressOption = None,
    database_url: DatabaseOption = None,
) -> None:
    """Deny a call of an interactive turn that a hook parked with Ask (--key signs it)."""
    from datetime import timedelta

    who = _approver(by, key)
    validity = timedelta(seconds=expires_in)
    run_command(
        _answer(
            turn_id,
            call_id,
            temporal_address,
            lambda h: h.deny(call_id, reason, by=who, key=key, expires_in=validity),
            database_url,
        )
    )
    signed = f" (signed by {who})" if key is not None else ""
    console.print(Text(f"denied {call_id} of {turn_id}{signed}"), soft_wrap=True)


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


@app.command()
def approvals(
    turn_id: Annotated[str | None, typer.Argument(help="The turn id (or `history`).")] = None,
    history_of: Annotated[
        str | None, typer.Argument(metavar="[TURN]", help="With `history`: the turn.")
    ] = None,
    all_turns: Annotated[
        bool,
        typer.Option(
            "--all", help="Every call waiting for approval, across running turns (oldest first)."
        ),
    ] = False,
    temporal_address: AddressOption = None,
    database_url: DatabaseOption = None,
    json_output: JsonOption = False,
) -> None:
    """List the calls waiting for approval: of one turn, or of every running turn (--all).

    `tooltrail approvals history TURN` shows every decision on the turn's asks and every
    answer it refused: who decided, whether it was signed, and whether the signature still
    verifies with the approvers configured now (TOOLTRAIL_APPROVERS, TOOLTRAIL_APPROVERS_FILE).
    """
    from datetime import UTC

    from tooltrail.client import Tooltrail, WaitingApproval

    if history_of is not None:
        if turn_id != "history":
            raise typer.BadParameter("one TURN, or `history TURN`")
        _approval_history(history_of, database_url, json_output)
        return
    if (turn_id is None) == (not all_turns):
        raise typer.BadParameter("give a TURN, or --all (not both)")

    async def go() -> list[WaitingApproval]:
        if all_turns:
            client = await _client(temporal_address)
            tt = Tooltrail(client, Host(), task_queue="", store=None)  # type: ignore[arg-type]
            return await tt.waiting_approvals()
        assert turn_id is not None
        handle = await _turn_handle(turn_id, temporal_address)
        try:
            description = await handle.workflow_handle.describe()
        except RPCError as exc:
            raise CommandError(rpc_error_text(exc, f"turn {turn_id!r}")) from exc
        if description.close_time is not None:
            return []  # an ended turn waits for nothing (and a query would need a worker)
        pending = await handle.pending_approvals()
        return [WaitingApproval(turn_id=turn_id, **p.model_dump()) for p in pending]

    pending = run_command(go())
    now = datetime.now(UTC)
    if json_output:
        print_json(
            console,
            [
                {
                    **p.model_dump(mode="json"),
                    "age_s": None if p.asked_at is None else (now - p.asked_at).total_seconds(),
                }
                for p in pending
            ],
        )
        return
    if not pending:
        console.print("nothing is waiting for approval")
        return
    from rich.table import Table

    from tooltrail.cli.render import id_column

    table = Table(title="Waiting for approval", title_justify="left")
    id_column(table, "turn")
    id_column(table, "call")
    id_column(table, "tool")
    table.add_column("waiting", justify="right", no_wrap=True)
    table.add_column("deadline", no_wrap=True)
    table.add_column("question", overflow="fold")
    for item in pending:
        age = "" if item.asked_at is None else _duration((now - item.asked_at).total_seconds())
        deadline = ""
        if item.deadline is not None:
            left = (item.deadline - now).total_seconds()
            local = item.deadline.astimezone().strftime("%Y-%m-%d %H:%M:%S")
            deadline = f"{local} (in {_duration(left)})"
        table.add_row(
            Text(item.turn_id),
            Text(item.tool_call_id),
            Text(item.tool_name),
            age,
            deadline,
            Text(preview(item.question, 200)),
        )
    print_table(console, table)


def _approval_history(turn_id: str, database_url: str | None, json_output: bool) -> None:
    """Print a turn's approval history (``approvals history TURN``)."""
    from tooltrail.db.approvals import list_rejections
    from tooltrail.ops.approval_history import ApprovalRecord, approval_history

    try:
        approvers = Settings().approver_keys()
    except ConfigurationError as exc:
        raise CommandError(str(exc)) from exc

    async def read(store: Any) -> list[ApprovalRecord]:
        turn = await store.turn(turn_id)
        rejections = await list_rejections(store, turn_id)
        if turn is None and not rejections:
            raise CommandError(f"no such turn {turn_id!r} in the audit database")
        return approval_history(await store.events(turn_id), rejections, approvers)

    records = run_command(with_store(resolve_database_url(database_url), read))
    if json_output:
        print_json(console, [r.model_dump(mode="json") for r in records])
        return
    if not records:
        console.print("no call of this turn asked for approval")
        return
    from rich.table import Table

    from tooltrail.cli.render import id_column

    table = Table(title=f"Approvals of {turn_id}", title_justify="left")
    table.add_column("at", no_wrap=True)
    id_column(table, "call")
    table.add_column("outcome", no_wrap=True)
    table.add_column("by", overflow="fold")
    table.add_column("signature", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for record in records:
        if not record.signed:
            signature = "unsigned"
        else:
            signature = "verifies" if record.verifies else "DOES NOT VERIFY"
        detail = record.problem if record.outcome == "rejected" or not record.verifies else None
        table.add_row(
            record.at.astimezone().strftime("%Y-%m-%d %H:%M:%S"),
            Text(record.tool_call_id),
            Text(record.outcome),
            Text(record.by or ""),
            signature,
            Text(preview(detail or record.reason or "", 200)),
        )
    print_table(console, table)


async def _client(temporal_address: str | None) -> Any:
    from tooltrail.runtime.worker import connect_client, settings_client_options

    address, namespace = _client_options()
    return await connect_client(
        temporal_address or address,
        namespace=namespace,
        **settings_client_options(Settings()),
    )


@history_app.command("export")
def history_export(
    turn_id: Annotated[str | None, typer.Argument(help="The turn to export.")] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="File for one turn (default: stdout).")
    ] = None,
    recent: Annotated[
        int | None, typer.Option(help="Export the N newest turns into --directory.")
    ] = None,
    directory: Annotated[Path, typer.Option("-d", "--directory")] = Path("histories"),
    temporal_address: AddressOption = None,
) -> None:
    """Export turn histories in Temporal's JSON history format."""
    from tooltrail.ops.histories import export_history, export_recent

    if (turn_id is None) == (recent is None):
        raise typer.BadParameter("give a TURN, or --recent N (not both)")

    async def go() -> list[Path] | str:
        client = await _client(temporal_address)
        if recent is not None:
            return await export_recent(client, directory, limit=recent)
        return await export_history(client, turn_id or "")

    result = run_command(go())
    if isinstance(result, list):
        console.print(Text(f"exported {len(result)} histories to {directory}"), soft_wrap=True)
    elif output is None:
        console.file.write(result + "\n")
    else:
        output.write_text(result + "\n")
        console.print(Text(f"exported {turn_id} to {output}"), soft_wrap=True)


@app.command()
def replay(
    paths: Annotated[
        list[Path] | None, typer.Argument(help="History files or directories of them.")
    ] = None,
    query: Annotated[
        str | None,
        typer.Option(
            help="Replay turns fetched from the server, e.g. 'WorkflowType=\"TurnWorkflow\"'."
        ),
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many histories from --query.")] = 100,
    temporal_address: AddressOption = None,
    json_output: JsonOption = False,
) -> None:
    """Replay histories against the current workflow code; exit 1 on any nondeterminism."""
    from tooltrail.ops.histories import fetch_histories, load_histories, replay_histories

    if not paths and query is None:
        raise typer.BadParameter("give history files or directories, or --query")

    async def go() -> Any:
        histories = load_histories(paths or [])
        if query is not None:
            histories += await fetch_histories(
                await _client(temporal_address), query=query, limit=limit
            )
        return await replay_histories(histories)

    report = run_command(go())
    if json_output:
        print_json(console, [o.model_dump(mode="json") for o in report.outcomes])
    else:
        for outcome in report.outcomes:
            mark = "[green]ok[/green]    " if outcome.ok else "[red]FAILED[/red]"
            console.print(f"{mark} {escape(outcome.source)}", soft_wrap=True)
            if outcome.error:
                console.print(f"       {outcome.error}", soft_wrap=True, markup=False)
        console.print(
            f"{len(report.outcomes) - len(report.failures)} replayed, "
            f"{len(report.failures)} nondeterministic"
        )
    if not report.outcomes:
        errors.print("[red]error:[/red] no histories to replay")
        raise typer.Exit(1)
    if not report.ok:
        raise typer.Exit(1)


def _confirm_live_rerun(original: Any, where: str, yes: bool) -> None:
    """Say which code runs a live rerun, and ask before tools run again for real.

    Raises:
        CommandError: the calls would run and nobody confirmed (no ``--yes``, no "y").
    """
    import click

    from tooltrail.ops.reruns import calls_that_would_run

    calls = calls_that_would_run(original)
    errors.print(
        Text(
            f"rerun runs the turn's calls on the workers of {where}: their code and host "
            "wiring, not --tools (which only describes the tools to the new turn)"
        ),
        soft_wrap=True,
    )
    if not calls or yes:
        return
    counts: dict[str, int] = {}
    for call in calls:
        counts[call.name] = counts.get(call.name, 0) + 1
    listed = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in counts.items())
    question = (
        f"Run {len(calls)} tool call{'s' if len(calls) > 1 else ''} again for real, side "
        f"effects included ({listed})?"
    )
    try:
        confirmed = click.confirm(question, default=False, err=True)
    except click.exceptions.Abort:  # no answer (stdin closed): the prompt's line ends here
        errors.print()
        confirmed = False
    if not confirmed:
        raise CommandError(
            f"not confirmed: rerun would run {len(calls)} tool calls again ({listed}); "
            "pass --yes to run them, or --shadow to run nothing"
        )


@app.command()
def rerun(
    turn_id: Annotated[str, typer.Argument(help="The turn to run again.")],
    tools: ToolsOption,
    shadow: Annotated[
        bool,
        typer.Option("--shadow", help="Serve tool results from the audit trail (no side effects)."),
    ] = False,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", "-y", help="Run the tools again without asking (a live rerun asks first)."
        ),
    ] = False,
    session: Annotated[str | None, typer.Option(help="Session of the new turn.")] = None,
    temporal_address: AddressOption = None,
    task_queue: TaskQueueOption = None,
    database_url: DatabaseOption = None,
    json_output: JsonOption = False,
) -> None:
    """Run a past turn's calls again (or in shadow) and show where the new turn differs.

    A live rerun runs the tools again on the workers of the task queue (their code, not
    --tools), so it asks first; exit 3 when the new turn differs.
    """
    import tooltrail
    from tooltrail.ops.reruns import load_turn

    host = load_host(tools)
    settings = Settings()
    where = (
        f"task queue {task_queue or settings.task_queue!r} "
        f"(Temporal at {temporal_address or settings.temporal_address})"
    )

    async def go() -> Any:
        async with tooltrail.connect(
            host,
            temporal_address=temporal_address,
            task_queue=task_queue,
            database_url=database_url,
        ) as tt:
            if not shadow:
                _confirm_live_rerun(await load_turn(tt.store, turn_id), where, yes)
            return await tt.rerun(turn_id, shadow=shadow, session_id=session)

    report = run_command(go())
    if json_output:
        print_json(console, report.model_dump(mode="json"))
    else:
        _print_rerun(report)
    if not report.same:
        raise typer.Exit(EXIT_FOUND)  # a gate fails when the turn now goes differently


def _print_rerun(report: Any) -> None:
    from rich.table import Table

    from tooltrail.cli.render import id_column

    console.print(
        Text(f"{report.mode} of {report.original_turn_id}: {report.new_turn_id}"), soft_wrap=True
    )
    if report.same:
        console.print(Text("no difference", style="green"))
        return
    table = Table(title="Divergences", title_justify="left")
    id_column(table, "call")
    table.add_column("aspect", no_wrap=True)
    table.add_column("original", overflow="fold")
    table.add_column("now", overflow="fold")
    for item in report.divergences:
        table.add_row(
            Text(item.tool_call_id or "(turn)"),
            Text(item.aspect),
            Text(str(item.original)),
            Text(str(item.now)),
        )
    print_table(console, table)


@db_app.command("upgrade")
def db_upgrade(
    database_url: DatabaseOption = None,
    revision: Annotated[str, typer.Option(help="Target revision.")] = "head",
) -> None:
    """Apply the migrations to the audit database."""
    from tooltrail.db.migrate import current_revision, upgrade

    url = resolve_database_url(database_url)
    run_command(upgrade(url, revision))
    console.print(f"database at revision {run_command(current_revision(url))}")


@db_app.command("current")
def db_current(database_url: DatabaseOption = None, json_output: JsonOption = False) -> None:
    """Print the audit database's revision and the code's head; exit 3 when it is behind."""
    from tooltrail.db.migrate import current_revision, head_revision

    current = run_command(current_revision(resolve_database_url(database_url)))
    head = head_revision()
    if json_output:
        print_json(console, {"current": current, "head": head, "up_to_date": current == head})
    else:
        console.print(f"current: {current}\nhead:    {head}")
        if current != head:
            errors.print("the database is not at the code's head: run `tooltrail db upgrade`")
    if current != head:
        raise typer.Exit(EXIT_FOUND)


def _json_mode(argv: list[str]) -> None:
    """With ``--json``, keep stdout for the JSON: everything else written to fd 1 goes to stderr.

    The redirection is at the file descriptor, so it also covers what child processes (the
    embedded Temporal server's banner) and native code write.
    """
    options = argv[: argv.index("--")] if "--" in argv else argv
    if "--json" not in options:
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    send_json_to(os.fdopen(saved, "w", encoding="utf-8"))


def main() -> None:
    """Entry point of the ``tooltrail`` command."""
    from tooltrail.logs import configure_logging, forward_core_logs

    code = 0
    try:
        _json_mode(sys.argv[1:])
        try:
            configure_logging()
        except Exception as exc:  # bad settings must still let `tooltrail config show` run
            errors.print(Text(f"warning: logging not configured: {exc}", style="yellow"))
        # The Temporal core logs to stdout by default: through Python logging instead.
        forward_core_logs()
        # Schema checks open a migration context on every start; its INFO lines are noise.
        logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)
        app()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except TooltrailError as exc:
        # An everyday mistake caught outside a command's own handling (`--tools nosuch:x`).
        error_line(str(exc))
        code = EXIT_ERROR
    except RPCError as exc:
        error_line(rpc_error_text(exc))
        code = EXIT_ERROR
    # The Temporal SDK's runtime threads can crash interpreter finalisation after all work
    # succeeded (exit 134/139); the command's own verdict is what counts.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@approvers_app.command("keygen")
def approvers_keygen(
    name: Annotated[str, typer.Argument(help="The approver's name, as the workers list it.")],
    out: Annotated[
        Path, typer.Option("-o", "--out", help="The private key file to write (mode 0600).")
    ],
    json_output: JsonOption = False,
) -> None:
    """Make an approver's Ed25519 key pair: the private key to a file, the public key shown.

    Give the printed `NAME:KEY` entry to the workers (TOOLTRAIL_APPROVERS or
    TOOLTRAIL_APPROVERS_FILE, or Host(approvers=...)); the approver signs with
    `tooltrail approve TURN CALL --key FILE --by NAME`.
    """
    from tooltrail.ops.approver_keys import (
        generate_approver_key,
        public_key_text,
        write_approver_key,
    )

    if not name or any(c in name for c in ":,#\n"):
        raise CommandError(f"an approver name has no ':', ',', '#' or newline: {name!r}")
    key = generate_approver_key()
    try:
        write_approver_key(key, out)
    except FileExistsError:
        raise CommandError(f"{out} exists; a key file is never overwritten") from None
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {exc.strerror}") from None
    entry = f"{name}:{public_key_text(key)}"
    if json_output:
        print_json(
            console, {"name": name, "public_key": public_key_text(key), "key_file": str(out)}
        )
        return
    console.print(Text(f"wrote the private key of {name!r} to {out} (keep it to yourself)"))
    console.print(Text(f"approver entry for the workers: {entry}"), soft_wrap=True)


def _register_run_commands() -> None:
    # In their own module (others edit this one); registered here, where ``app`` lives.
    from tooltrail.cli.agent_runs import cancel_command, fork_command

    app.command("cancel")(cancel_command)
    app.command("fork")(fork_command)


_register_run_commands()

if __name__ == "__main__":  # pragma: no cover - `python -m tooltrail.cli` uses __main__.py
    main()
