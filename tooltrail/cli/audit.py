"""``tooltrail audit``: ``list`` (or ``--stuck``), ``show``, ``reconcile`` and ``verify``.

``audit show`` hands an id that is no turn's to ``agent_runs.show_run``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import typer
from rich.text import Text

from tooltrail.cli._shared import (
    EXIT_FOUND,
    audit_app,
    console,
    error_line,
    fail,
    load_host,
    resolve_database_url,
    run_command,
    temporal_client,
    with_store,
)
from tooltrail.cli.options import AddressOption, DatabaseOption, JsonOption, TaskQueueOption
from tooltrail.cli.render import (
    model_calls_table,
    model_totals_line,
    print_json,
    print_table,
    print_text,
    results_table,
    safe_text,
    timeline_table,
    turns_table,
)
from tooltrail.settings import Settings

__all__ = ["audit_list", "audit_reconcile", "audit_show", "audit_verify"]


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
        typer.Option(help="completed, failed, cancelled, terminated, timed_out, lost or running."),
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
    from tooltrail.pipeline.host import Host

    async def go() -> list[Any]:
        client = await temporal_client(temporal_address)
        tt = Tooltrail(client, Host(), task_queue="", store=None)  # type: ignore[arg-type]
        found: list[Any] = await tt.stuck_turns(limit=limit)
        return found

    found = run_command(go())
    if json_output:
        print_json(console, [s.model_dump(mode="json") for s in found])
    elif not found:
        console.print("no stuck turns")
    for item in [] if json_output else found:
        print_text(
            console,
            Text("stuck ", style="red")
            + safe_text(
                f"{item.turn_id}: workflow task attempt {item.attempts} "
                f"(started {item.started_at:%Y-%m-%d %H:%M:%S})"
            ),
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
    from tooltrail.db.model_calls import list_model_calls, totals

    async def read(store: Any) -> tuple[Any, list[Any], list[Any], list[Any]]:
        async with store.sessions() as session:
            calls = await list_model_calls(session, turn_id=turn_id)
        return (
            await store.turn(turn_id),
            await store.events(turn_id, all_runs=True),
            await store.runs(turn_id),
            calls,
        )

    turn, every, runs, calls = run_command(with_store(resolve_database_url(database_url), read))
    if turn is None and not every and not calls:
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
    # The model calls of the runs shown (all of them when the turn has no row yet).
    shown_ids = {r.run_id for r in shown}
    calls = [c for c in calls if all_runs or not shown_ids or c.temporal_run_id in shown_ids]
    if json_output:
        print_json(
            console,
            {
                "turn": None if turn is None else turn.model_dump(mode="json"),
                "runs": [_run_json(run, by_run) for run in shown],
                "events": [
                    e.model_dump(mode="json") for run in shown for e in by_run.get(run.run_id, [])
                ],
                "model_calls": [call.model_dump(mode="json") for call in calls],
                "model_totals": totals(calls).model_dump(mode="json"),
            },
        )
        return
    if turn is not None:
        print_text(
            console,
            Text("turn ")
            + safe_text(turn.turn_id, style="bold")
            + safe_text(f"  session {turn.session_id}  status {turn.status}")
            + safe_text(f"  error: {turn.error}" if turn.error else ""),
        )
    for run in shown or [None]:
        events = by_run.get(latest if run is None else run.run_id, [])
        if run is not None and (len(runs) > 1 or run.run_id):
            print_text(console, _run_line(run, by_run))
        print_table(console, timeline_table(events, full=full))
        _print_rebuilt(events)
        _print_lost_attempts(events)
        end = next((e for e in reversed(events) if e.kind == "turn_end"), None)
        if end is not None and end.payload.get("results"):
            from tooltrail.core.results import ToolDispatchResult

            results = [ToolDispatchResult.model_validate(r) for r in end.payload["results"]]
            print_table(console, results_table(results, title="Results returned to the model"))
    if calls:
        print_table(console, model_calls_table(calls, full=full))
        print_text(console, model_totals_line(totals(calls)))


def _print_rebuilt(events: list[Any]) -> None:
    rebuilt = sum(1 for e in events if e.payload.get("rebuilt") is True)
    if rebuilt:
        console.print(
            Text(
                f"{rebuilt} of {len(events)} records rebuilt from Temporal's history by "
                "reconciliation: the turn closed before its first write",
                style="magenta",
            ),
            soft_wrap=True,
        )


def _branch(run: Any, by_run: dict[str, list[Any]]) -> int | None:
    from tooltrail.core.branches import branch_point

    if run.branched_from is None:
        return None
    return branch_point(by_run.get(run.branched_from, []), by_run.get(run.run_id, []))


def _run_json(run: Any, by_run: dict[str, list[Any]]) -> dict[str, Any]:
    return {**run.model_dump(mode="json"), "branch_seq": _branch(run, by_run)}


def _run_line(run: Any, by_run: dict[str, list[Any]]) -> Text:
    line = Text("run ") + safe_text(run.run_id or "(no run id)", style="bold")
    line += Text(" (latest)" if run.latest else " (earlier run)")
    seq = _branch(run, by_run)
    if seq is not None:
        line += safe_text(
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
            print_text(
                console,
                Text("lost ", style="red")
                + safe_text(
                    f"call {event.tool_call_id} attempt {event.attempt}: Temporal attempt "
                    f"{item.get('temporal_attempt')} on worker {item.get('worker') or 'unknown'} "
                    f"was lost; attempt {event.temporal_attempt} on {event.worker} completed it"
                ),
            )


@audit_app.command("reconcile")
def audit_reconcile(
    since: Annotated[
        str | None, typer.Option(help="Only turns started at or after (ISO time).")
    ] = None,
    task_queue: TaskQueueOption = None,
    tools: Annotated[
        str | None,
        typer.Option(
            "--tools",
            envvar="TOOLTRAIL_TOOLS",
            help=(
                "MODULE:ATTR naming the workers' Host: its RedactingMiddleware rules redact "
                "what a trail rebuilt from a history stores."
            ),
        ),
    ] = None,
    temporal_address: AddressOption = None,
    database_url: DatabaseOption = None,
    json_output: JsonOption = False,
) -> None:
    """Give turns that ended outside tooltrail (terminated, timed out, ...) their true status.

    Turns of the task queue that Temporal closed with no row at all (they ended before their
    first write) are rebuilt from their histories.
    """
    from tooltrail.runtime.reconciler import host_redactors, reconcile

    started_since = _parse_time(since)
    redactors = host_redactors(load_host(tools)) if tools is not None else []
    queue = task_queue or Settings().task_queue

    async def go(store: Any) -> Any:
        client = await temporal_client(temporal_address)
        return await reconcile(
            client, store, since=started_since, task_queue=queue, redactors=redactors
        )

    report = run_command(with_store(resolve_database_url(database_url), go))
    if json_output:
        print_json(console, report.model_dump(mode="json"))
        return
    print_text(
        console,
        safe_text(
            f"{report.checked} running turns checked: {len(report.changed)} reconciled, "
            f"{report.still_running} running in Temporal too, "
            f"{len(report.missing)} unknown to Temporal (lost); "
            f"{len(report.rebuilt)} closed turns with no row rebuilt from their histories"
            + (f", {len(report.unreadable)} unreadable here" if report.unreadable else "")
        ),
    )
    for item in report.changed:
        print_text(
            console,
            safe_text(f"{item.turn_id}: running -> ")
            + safe_text(str(item.status), style="bold")
            + safe_text(f" ({item.detail})" if item.detail else ""),
        )
    for item in report.rebuilt:
        print_text(
            console,
            safe_text(f"{item.turn_id}: no row -> ")
            + safe_text(str(item.status), style="bold")
            + Text(" rebuilt from its history")
            + safe_text(f" ({item.detail})" if item.detail else ""),
        )
    for item in report.missing:
        print_text(
            console,
            safe_text(f"{item.turn_id}: running -> ")
            + safe_text(str(item.status or "running"), style="bold")
            + safe_text(f" (unknown to Temporal: {item.detail})"),
        )
    for item in report.unreadable:
        print_text(console, safe_text(f"{item.turn_id}: ") + safe_text(item.detail, style="yellow"))


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
    tools: Annotated[
        str | None,
        typer.Option(
            "--tools",
            envvar="TOOLTRAIL_TOOLS",
            help=(
                "MODULE:ATTR naming the workers' Host: its RedactingMiddleware rules redact "
                "the inputs Temporal ran before they are compared with the trail's."
            ),
        ),
    ] = None,
    temporal_address: AddressOption = None,
    database_url: DatabaseOption = None,
    json_output: JsonOption = False,
) -> None:
    """Check turns' trails against Temporal's histories; exit 1 on a mismatch, 2 unchecked.

    With --session or --since the turns are those the audit database lists and those
    Temporal's visibility lists, so a turn deleted from the database is reported, not skipped.
    """
    from tooltrail.ops.verify import verify_turn, verify_turns
    from tooltrail.pipeline.middleware import RedactingMiddleware

    redactors = []
    if tools is not None:
        host = load_host(tools)
        redactors = [m for m in host.middleware if isinstance(m, RedactingMiddleware)]

    if (turn_id is None) == (session is None and since is None):
        raise typer.BadParameter("give a TURN, or --session S and/or --since T")
    started_since = _parse_time(since)

    async def go(store: Any) -> list[Any]:
        client = await temporal_client(temporal_address)
        # Signed approvals are re-checked against the approvers configured in the settings.
        approvers = Settings().approver_keys()
        if turn_id is not None:
            return [
                await verify_turn(client, store, turn_id, approvers=approvers, redactors=redactors)
            ]
        return await verify_turns(
            client,
            store,
            session_id=session,
            since=started_since,
            limit=limit,
            approvers=approvers,
            redactors=redactors,
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
        print_text(
            console,
            mark
            + safe_text(
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
        )
        for problem in report.problems:
            print_text(console, f"  {problem.kind}: {problem.detail}")
    if mismatch:
        raise typer.Exit(EXIT_MISMATCH)
    if unchecked:
        raise typer.Exit(EXIT_CANNOT_CHECK)
