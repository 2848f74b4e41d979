"""``tooltrail rerun``: run a past turn's calls again (or in shadow) and show what differs."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.text import Text

from tooltrail.cli._shared import (
    EXIT_FOUND,
    CommandError,
    app,
    console,
    errors,
    load_host,
    run_command,
)
from tooltrail.cli.options import (
    AddressOption,
    DatabaseOption,
    JsonOption,
    TaskQueueOption,
    ToolsOption,
)
from tooltrail.cli.render import print_json, print_table
from tooltrail.settings import Settings

__all__ = ["rerun"]


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
