"""Agent runs from the command line: ``audit show RUN``, ``cancel``, ``fork``, ``run`` on a cluster.

``tooltrail.cli`` registers these commands (``app.command(...)(cancel_command)``) and calls
``show_run`` when ``audit show`` is given an id that is not a turn's. What the commands
share comes from ``tooltrail.cli._shared``, so nothing here imports the command module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from tooltrail.cli.options import (
    AddressOption,
    DatabaseOption,
    JsonOption,
    NamespaceOption,
    TaskQueueOption,
)
from tooltrail.cli.render import (
    cost_text,
    id_column,
    model_totals_line,
    preview,
    print_json,
    print_table,
    print_text,
    safe_text,
)

if TYPE_CHECKING:
    from tooltrail.core.wire import TurnRecord
    from tooltrail.db.model_calls import ModelCallTotals
    from tooltrail.db.runs import ConversationRow

__all__ = ["cancel_command", "fork_command", "run_on_cluster", "show_run"]

_STATUS_STYLES = {
    "completed": "green",
    "failed": "red",
    "terminated": "red",
    "timed_out": "red",
    "lost": "red",
    "cancelled": "yellow",
    "running": "cyan",
}


# -- audit show RUN ---------------------------------------------------------------------------


def show_run(run_id: str, *, database_url: str | None, full: bool, json_output: bool) -> bool:
    """Print an agent run's turns, conversation and fork links; ``False`` if it has none.

    Everything comes from the audit database: a run whose Temporal history is gone still
    shows.
    """
    from tooltrail.cli._shared import console, resolve_database_url, run_command, with_store
    from tooltrail.db.model_calls import list_model_calls, totals
    from tooltrail.db.runs import list_run_links, list_run_turns, load_run_rows

    async def read(store: Any) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
        async with store.sessions() as session:
            return (
                await list_run_turns(session, run_id=run_id),
                await load_run_rows(session, run_id=run_id),
                await list_run_links(session, run_id=run_id),
                await list_model_calls(session, run_id=run_id),
            )

    turns, rows, links, calls = run_command(with_store(resolve_database_url(database_url), read))
    if not (turns or rows or links):
        return False
    by_turn: dict[str, list[Any]] = {}
    for call in calls:
        by_turn.setdefault(call.turn_id, []).append(call)
    sums = {turn.turn_id: totals(by_turn.get(turn.turn_id, [])) for turn in turns}
    if json_output:
        print_json(
            console,
            {
                "run_id": run_id,
                "turns": [
                    {**turn.model_dump(mode="json"), **_turn_usage(sums[turn.turn_id])}
                    for turn in turns
                ],
                "model_totals": totals(calls).model_dump(mode="json"),
                "conversation": [
                    {"seq": row.seq, **row.message.model_dump(mode="json")} for row in rows
                ],
                "links": [
                    {**link.model_dump(mode="json"), "text": link.describe()} for link in links
                ],
            },
        )
        return True
    print_text(console, Text("run ") + safe_text(run_id, style="bold"))
    for link in links:
        print_text(console, link.describe())
    if turns:
        print_table(console, _turns_table(turns, sums))
    else:
        console.print("no turns recorded yet")
    if calls:
        print_text(console, model_totals_line(totals(calls)))
    print_table(console, _conversation_table(rows, full=full))
    return True


def _turn_usage(sums: ModelCallTotals) -> dict[str, Any]:
    """A turn's model calls in its JSON: how many, their tokens and estimated cost."""
    return {
        "model_calls": sums.calls,
        "failed_model_calls": sums.failed,
        "input_tokens": sums.input_tokens,
        "cached_tokens": sums.cached_tokens,
        "output_tokens": sums.output_tokens,
        "reasoning_tokens": sums.reasoning_tokens,
        "cost_usd": sums.cost_usd,
    }


def _turns_table(turns: list[TurnRecord], sums: dict[str, ModelCallTotals]) -> Table:
    table = Table(title="Turns", title_justify="left")
    id_column(table, "turn")
    for column in ("status", "calls", "model calls", "in", "out", "cost", "started", "error"):
        right = column in ("calls", "model calls", "in", "out", "cost")
        table.add_column(column, no_wrap=column != "error", justify="right" if right else "left")
    for turn in turns:
        usage = sums[turn.turn_id]
        failed = f" ({usage.failed} failed)" if usage.failed else ""
        table.add_row(
            safe_text(turn.turn_id),
            safe_text(turn.status, style=_STATUS_STYLES.get(turn.status, "")),
            str(turn.call_count),
            f"{usage.calls}{failed}",
            f"{usage.input_tokens:,}",
            f"{usage.output_tokens:,}",
            cost_text(usage.cost_usd),
            turn.started_at.strftime("%Y-%m-%d %H:%M:%S"),
            safe_text(preview(turn.error or "", 60)),
        )
    return table


def _conversation_table(rows: list[ConversationRow], *, full: bool) -> Table:
    table = Table(title="Conversation", title_justify="left")
    table.add_column("#", no_wrap=True, justify="right")
    table.add_column("role", no_wrap=True)
    table.add_column("message")
    for row in rows:
        message = row.message
        text = message.content or message.refusal or ""
        if message.role == "tool":
            marker = " (error)" if message.is_error else ""
            text = f"{message.name or '?'} [{message.tool_call_id}]{marker}: {text}"
        calls = ", ".join(f"{call.name} [{call.id}]" for call in message.tool_calls)
        if calls:
            text = f"{text}\n-> {calls}" if text else f"-> {calls}"
        table.add_row(str(row.seq), message.role, safe_text(text if full else preview(text, 100)))
    return table


# -- cancel -----------------------------------------------------------------------------------


def cancel_command(
    workflow_id: Annotated[str, typer.Argument(help="A turn id or an agent run id.")],
    temporal_address: AddressOption = None,
    namespace: NamespaceOption = None,
    json_output: JsonOption = False,
) -> None:
    """Cancel a turn or a whole agent run (its turn in flight too).

    A turn or run that has already finished is left as it is, and the command says so in
    one line (exit 0: nothing is running either way).
    """
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    from tooltrail.cli._shared import CommandError, console, rpc_error_text, run_command

    async def go() -> dict[str, Any]:
        client = await _connect(temporal_address, namespace)
        handle = client.get_workflow_handle(workflow_id)
        try:
            description = await handle.describe()
        except RPCError as exc:
            raise CommandError(rpc_error_text(exc, f"turn or run {workflow_id!r}")) from exc
        kind = "run" if description.workflow_type == "AgentRunWorkflow" else "turn"
        status = description.status
        if status != WorkflowExecutionStatus.RUNNING:
            name = status.name.lower() if status is not None else "closed"
            return {"id": workflow_id, "kind": kind, "cancelled": False, "status": name}
        await handle.cancel()
        return {"id": workflow_id, "kind": kind, "cancelled": True, "status": "running"}

    outcome = run_command(go())
    if json_output:
        print_json(console, outcome)
    elif outcome["cancelled"]:
        console.print(
            Text(f"cancellation of {outcome['kind']} {workflow_id} requested"), soft_wrap=True
        )
    else:
        console.print(
            Text(
                f"{outcome['kind']} {workflow_id} has already finished ({outcome['status']}); "
                "nothing to cancel"
            ),
            soft_wrap=True,
        )


async def _connect(temporal_address: str | None, namespace: str | None) -> Any:
    from tooltrail.runtime.worker import connect_client, settings_client_options
    from tooltrail.settings import Settings

    settings = Settings()
    return await connect_client(
        temporal_address or settings.temporal_address,
        namespace=namespace or settings.namespace,
        **settings_client_options(settings),
    )


# -- fork -------------------------------------------------------------------------------------


def fork_command(
    run_id: Annotated[str, typer.Argument(help="The agent run to fork.")],
    from_turn: Annotated[
        int,
        typer.Option(
            "--from-turn",
            help="Start again from this turn (0-based, as in turn ids): its model call is "
            "asked again.",
        ),
    ],
    message: Annotated[
        str | None,
        typer.Option(help="Replace the text of the last user message before that turn."),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="The model (default: the original run's).")
    ] = None,
    max_turns: Annotated[
        int | None, typer.Option(min=1, help="At most this many turns of the new run.")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the new run's answer and print it.")
    ] = False,
    temporal_address: AddressOption = None,
    namespace: NamespaceOption = None,
    task_queue: TaskQueueOption = None,
    database_url: DatabaseOption = None,
    json_output: JsonOption = False,
) -> None:
    """Start a new agent run from turn K of a run; both runs' trails record the fork.

    The new run's conversation is the original's up to turn K, optionally with the last
    user message replaced. Prints the new run's id (and with --wait, its answer).
    """
    import tooltrail
    from tooltrail.cli._shared import console, run_command

    async def go() -> tuple[str, Any]:
        async with tooltrail.connect(
            temporal_address=temporal_address,
            namespace=namespace,
            task_queue=task_queue,
            database_url=database_url,
        ) as tt:
            handle = await tt.fork_agent(
                run_id, from_turn=from_turn, message=message, model=model, max_turns=max_turns
            )
            return handle.run_id, (await handle.result()) if wait else None

    new_run_id, result = run_command(go())
    if json_output:
        print_json(
            console,
            {
                "run_id": new_run_id,
                "forked_from": run_id,
                "from_turn": from_turn,
                "result": None if result is None else result.model_dump(mode="json"),
            },
        )
        return
    console.print(Text(new_run_id), soft_wrap=True)
    if result is not None:
        console.print(Text(result.text or f"(no answer: stopped by {result.stopped_by})"))


# -- run on a cluster -------------------------------------------------------------------------


def run_on_cluster(
    prompt: str,
    *,
    temporal_address: str,
    namespace: str | None,
    task_queue: str | None,
    database_url: str | None,
    session_id: str,
    model: str | None,
    system: str | None,
    max_turns: int,
    local_model: bool,
    detach: bool,
    json_output: bool,
) -> None:
    """``tooltrail run`` against a deployment: its workers (and their model client) run it.

    With ``detach``, print the run id as soon as the run has started and return.
    """
    import tooltrail
    from tooltrail.cli._shared import console, errors, run_command

    async def go() -> tuple[str, Any]:
        async with tooltrail.connect(
            temporal_address=temporal_address,
            namespace=namespace,
            task_queue=task_queue,
            database_url=database_url,
        ) as tt:
            handle = await tt.start_agent(
                prompt,
                session_id=session_id,
                model=model,
                system=system,
                max_turns=max_turns,
                local_model=local_model,
            )
            return handle.run_id, None if detach else await handle.result()

    run_id, result = run_command(go())
    if result is None:
        if json_output:
            print_json(console, {"run_id": run_id, "session_id": session_id})
        else:
            console.print(Text(run_id), soft_wrap=True)
        return
    if json_output:
        print_json(console, result.model_dump(mode="json"))
    else:
        console.print(Text(result.text or f"(no answer: stopped by {result.stopped_by})"))
        errors.print(Text(f"run {result.run_id}: {len(result.turns)} turns"), soft_wrap=True)
