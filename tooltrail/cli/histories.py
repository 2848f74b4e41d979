"""Temporal's histories of turns: ``history export`` and ``replay``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from tooltrail.cli._shared import app, console, errors, history_app, run_command, temporal_client
from tooltrail.cli.options import AddressOption, JsonOption
from tooltrail.cli.render import escape, print_json

__all__ = ["history_export", "replay"]


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
        client = await temporal_client(temporal_address)
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
                await temporal_client(temporal_address), query=query, limit=limit
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
