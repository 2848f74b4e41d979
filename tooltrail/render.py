"""Human-readable views of turns and audit trails (Rich), shared by the CLI and the demo."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tooltrail.db.store import TurnSummary
from tooltrail.results import ToolDispatchResult
from tooltrail.text import render_text
from tooltrail.wire import AuditEvent

__all__ = ["preview", "results_table", "timeline_table", "turns_table"]


def preview(text: str, width: int = 72) -> str:
    """One line of at most ``width`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "\u2026"


def results_table(results: Sequence[ToolDispatchResult], title: str = "Results") -> Table:
    """The results of a turn, in the model's order."""
    table = Table(title=title, title_justify="left")
    table.add_column("call")
    table.add_column("tool")
    table.add_column("status")
    table.add_column("ms", justify="right")
    table.add_column("output")
    for result in results:
        status = Text("soft error", style="yellow") if result.is_error else Text("ok", "green")
        table.add_row(
            result.tool_call_id,
            result.resolved_tool_name,
            status,
            f"{result.duration_ms:.1f}",
            preview(render_text(result.output)),
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
    if event.kind == "turn_cancelled":
        return Text(f"finished calls: {', '.join(payload.get('finished_calls', [])) or 'none'}")
    return Text(preview(str(payload), 10_000 if full else 80))


def timeline_table(events: Sequence[AuditEvent], *, full: bool = False, title: str = "") -> Table:
    """A turn's audit trail as a timeline: one row per event, times relative to the start."""
    table = Table(title=title or "Audit timeline", title_justify="left")
    table.add_column("seq", justify="right")
    table.add_column("+ms", justify="right")
    table.add_column("event")
    table.add_column("call")
    table.add_column("tool")
    table.add_column("att", justify="right")
    table.add_column("detail", overflow="fold")
    start = events[0].created_at if events else None
    for event in events:
        offset = (event.created_at - start).total_seconds() * 1000 if start else 0.0
        table.add_row(
            str(event.seq),
            f"{offset:.0f}",
            event.kind,
            event.tool_call_id or "",
            event.tool_name or "",
            "" if event.attempt is None else str(event.attempt),
            _event_detail(event, full),
        )
    return table


def turns_table(turns: Sequence[TurnSummary]) -> Table:
    """A list of turns, newest first."""
    table = Table(title="Turns", title_justify="left")
    for column in ("turn", "session", "status", "started", "calls", "errors", "events"):
        table.add_column(column)
    styles = {"completed": "green", "failed": "red", "cancelled": "yellow", "running": "cyan"}
    for turn in turns:
        table.add_row(
            turn.turn_id,
            turn.session_id,
            Text(turn.status, style=styles.get(turn.status, "")),
            turn.started_at.strftime("%Y-%m-%d %H:%M:%S"),
            str(turn.call_count),
            str(turn.error_results),
            str(turn.event_count),
        )
    return table


def print_json(console: Console, data: object) -> None:
    """Print JSON for machines (no colours, no wrapping)."""
    import json

    console.file.write(json.dumps(data, ensure_ascii=False, default=str) + "\n")
