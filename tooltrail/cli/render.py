"""Human-readable views of turns and audit trails (Rich), shared by the CLI and the demo.

Two rules for everything shown here:

- what a model, a caller or a tool chose (ids, tool names, arguments, outputs, errors) is
  shown as it is, never read as Rich markup: it goes into ``Text`` objects, or through
  ``escape`` where a line mixes it with markup of ours (a call id ``[/]`` would otherwise
  end a style, or make Rich raise);
- ids are never cut short: id columns do not wrap, and ``print_table`` widens the output
  beyond the terminal (or the 80 columns of a pipe) rather than cut one with an ellipsis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from tooltrail.core.text import render_text

if TYPE_CHECKING:
    # Annotations only: the views take what the commands read, and ``tooltrail --help``
    # loads no database layer.
    from tooltrail.core.results import ToolDispatchResult
    from tooltrail.core.wire import AuditEvent
    from tooltrail.db.store import TurnSummary

__all__ = [
    "escape",
    "id_column",
    "preview",
    "print_json",
    "print_table",
    "results_table",
    "send_json_to",
    "timeline_table",
    "turns_table",
]


def preview(text: str, width: int = 72) -> str:
    """One line of at most ``width`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "\u2026"


_UNLIMITED = 1_000_000


def id_column(table: Table, header: str, **options: Any) -> None:
    """Add a column for ids: never wrapped or cut (see ``print_table``)."""
    table.add_column(header, no_wrap=True, overflow="ignore", **options)


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` at least as wide as its id columns need, wider than the terminal if so.

    Rich fits a table to the console's width (80 columns when the output is a pipe) and, as
    a last resort, cuts every column with an ellipsis; an id cut short is useless to whoever
    copies it into the next command. Text columns wrap first; if the ids alone do not fit,
    the table is printed wider than the console.
    """
    # Measured without the console's limit (Rich clamps every measure to it).
    unlimited = console.options.update_width(_UNLIMITED)
    for column in table.columns:
        if column.no_wrap:
            # Rich measures a cell as narrow as its longest word, wrapping or not; a column
            # that must not wrap needs its whole width.
            widest = [Measurement.get(console, unlimited, cell).maximum for cell in column.cells]
            column.min_width = max([column.min_width or 0, len(str(column.header)), *widest])
    needed = Measurement.get(console, unlimited, table).minimum
    if needed <= console.width:
        console.print(table)
        return
    wide = Console(
        file=console.file,
        width=needed,
        color_system=console.color_system,  # type: ignore[arg-type]
        force_terminal=console.is_terminal,
        highlight=False,
    )
    wide.print(table)


def results_table(results: Sequence[ToolDispatchResult], title: str = "Results") -> Table:
    """The results of a turn, in the model's order."""
    table = Table(title=title, title_justify="left")
    id_column(table, "call")
    id_column(table, "tool")
    table.add_column("status", no_wrap=True)
    table.add_column("ms", justify="right", no_wrap=True)
    table.add_column("output", overflow="fold")
    for result in results:
        status = Text("soft error", style="yellow") if result.is_error else Text("ok", "green")
        table.add_row(
            Text(result.tool_call_id),
            Text(result.resolved_tool_name),
            status,
            f"{result.duration_ms:.1f}",
            Text(preview(render_text(result.output))),
        )
    return table


def _recovery_detail(payload: dict[str, object]) -> Text:
    action = payload.get("action")
    action = action if isinstance(action, dict) else {}
    analysis = payload.get("analysis")
    why = ""
    if isinstance(analysis, dict):
        judged = "recoverable" if analysis.get("is_recoverable") else "not recoverable"
        why = f" ({judged}, {analysis.get('severity')})"
    kind = action.get("kind")
    if kind == "retry":
        text = Text.assemble(
            ("retry", "cyan"),
            f" in {action.get('delay_ms')} ms as attempt {payload.get('next_attempt')}{why}",
        )
    else:
        reason = action.get("reason") or action.get("prompt") or ""
        text = Text.assemble((str(kind), "yellow"), f"{why}: {preview(str(reason), 60)}")
    problem = payload.get("correction_problem")
    if problem:
        text.append(f"; correction unusable: {problem}", style="red")
    return text


def _event_detail(event: AuditEvent, full: bool) -> Text:
    payload = event.payload
    if event.kind == "tool_call_received":
        return Text(f"input {preview(str(payload.get('input')), 10_000 if full else 60)}")
    if event.kind == "tool_post":
        output = payload.get("output")
        text = output if isinstance(output, str) else str(output)
        shown = text if full else preview(text, 60)
        style = "yellow" if payload.get("is_error") else "green"
        label = "soft error" if payload.get("is_error") else "ok"
        return Text.assemble((label, style), f" {payload.get('duration', 0):.1f} ms  {shown}")
    if event.kind == "tool_pre":
        return Text("")
    if event.kind == "recovery_decision":
        return _recovery_detail(payload)
    if event.kind == "turn_started":
        return Text(f"session {payload.get('session_id')}, {payload.get('calls')} calls")
    if event.kind == "turn_end":
        state = "success" if payload.get("success") else f"failed: {payload.get('error')}"
        return Text(
            f"phase {payload.get('phase')}, {state}, {payload.get('duration_ms', 0):.1f} ms"
        )
    if event.kind == "tool_routed":
        return Text(f"sent to {payload.get('task_queue')} (a worker there has the tool)")
    if event.kind == "turn_cancelled":
        return Text(f"finished calls: {', '.join(payload.get('finished_calls', [])) or 'none'}")
    return Text(preview(str(payload), 10_000 if full else 80))


def _event_kind(event: AuditEvent) -> Text:
    # Records reconciliation rebuilt from Temporal's history (the turn closed before its
    # first write) say so: what a worker wrote and what was read back differ in what they
    # can tell (no hook decisions, no memory).
    if event.payload.get("rebuilt") is True:
        return Text.assemble(event.kind, (" (rebuilt)", "magenta"))
    return Text(event.kind)


def timeline_table(events: Sequence[AuditEvent], *, full: bool = False, title: str = "") -> Table:
    """A turn's audit trail as a timeline: one row per event, times relative to the start."""
    table = Table(title=Text(title or "Audit timeline"), title_justify="left")
    table.add_column("seq", justify="right", no_wrap=True)
    table.add_column("+ms", justify="right", no_wrap=True)
    table.add_column("event", no_wrap=True)
    id_column(table, "call")
    id_column(table, "tool")
    table.add_column("att", justify="right", no_wrap=True)
    table.add_column("detail", overflow="fold")
    start = events[0].created_at if events else None
    for event in events:
        offset = (event.created_at - start).total_seconds() * 1000 if start else 0.0
        table.add_row(
            str(event.seq),
            f"{offset:.0f}",
            _event_kind(event),
            Text(event.tool_call_id or ""),
            Text(event.tool_name or ""),
            "" if event.attempt is None else str(event.attempt),
            _event_detail(event, full),
        )
    return table


def turns_table(turns: Sequence[TurnSummary]) -> Table:
    """A list of turns, newest first."""
    table = Table(title="Turns", title_justify="left")
    id_column(table, "turn")
    id_column(table, "session")
    for column in ("status", "started", "calls", "errors", "events"):
        table.add_column(column, no_wrap=True)
    styles = {
        "completed": "green",
        "failed": "red",
        "terminated": "red",
        "timed_out": "red",
        "cancelled": "yellow",
        "running": "cyan",
    }
    for turn in turns:
        table.add_row(
            Text(turn.turn_id),
            Text(turn.session_id),
            Text(turn.status, style=styles.get(turn.status, "")),
            turn.started_at.strftime("%Y-%m-%d %H:%M:%S"),
            str(turn.call_count),
            str(turn.error_results),
            str(turn.event_count),
        )
    return table


_json_stream: IO[str] | None = None


def send_json_to(stream: IO[str] | None) -> None:
    """Make ``print_json`` write to ``stream`` (the CLI's saved stdout in ``--json`` mode)."""
    global _json_stream
    _json_stream = stream


def print_json(console: Console, data: object) -> None:
    """Print JSON for machines (no colours, no wrapping), on the JSON stream if one is set."""
    import json

    out = _json_stream or console.file
    out.write(json.dumps(data, ensure_ascii=False, default=str) + "\n")
    out.flush()
