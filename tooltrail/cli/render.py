r"""Human-readable views of turns and audit trails (Rich), shared by the CLI and the demo.

Three rules for everything shown here:

- what a model, a caller or a tool chose (ids, tool names, arguments, outputs, errors) is
  shown as it is, never read as Rich markup: it goes into ``Text`` objects, or through
  ``escape`` where a line mixes it with markup of ours (a call id ``[/]`` would otherwise
  end a style, or make Rich raise);
- what they chose never reaches the terminal as control text: ``terminal_safe`` shows control
  characters, escape sequences and bidi overrides as visible escapes (``\x1b``, ``\u202e``),
  because a tool output that clears the screen, recolours the rows below it, hides a link
  behind harmless words or reverses a line would make the operator read something other
  than what was recorded. ``print_table`` applies it to every cell and ``print_text`` to a
  line; Rich itself strips a few (BEL, CR) and passes ESC through;
- ids are never cut short: id columns do not wrap, and ``print_table`` widens the output
  beyond the terminal (or the 80 columns of a pipe) rather than cut one with an ellipsis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.style import Style
from rich.table import Table
from rich.text import Text

from tooltrail.core.text import render_text

if TYPE_CHECKING:
    # Annotations only: the views take what the commands read, and ``tooltrail --help``
    # loads no database layer.
    from tooltrail.core.results import ToolDispatchResult
    from tooltrail.core.wire import AuditEvent
    from tooltrail.db.model_calls import ModelCall, ModelCallTotals
    from tooltrail.db.store import TurnSummary

__all__ = [
    "cost_text",
    "escape",
    "id_column",
    "model_calls_table",
    "model_totals_line",
    "preview",
    "print_json",
    "print_table",
    "print_text",
    "results_table",
    "safe_text",
    "send_json_to",
    "terminal_safe",
    "timeline_table",
    "turns_table",
]


def _visible(code: int) -> str:
    named = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
    if code in named:
        return named[code]
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


_BIDI_CONTROLS = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
"""Arabic letter mark, LRM, RLM, the embeddings and overrides (LRE..RLO) and the isolates."""
_UNSAFE = (
    *range(0x00, 0x20),  # C0, ESC among them
    0x7F,  # DEL
    *range(0x80, 0xA0),  # C1: 0x9B is a one-byte CSI to terminals that read them
    *_BIDI_CONTROLS,
    # Lone surrogates (a JSON "\ud800" decodes to one): unencodable, they would make the
    # command fail with a UnicodeEncodeError in the middle of its output.
    *range(0xD800, 0xE000),
)
_SINGLE_LINE = {code: _visible(code) for code in _UNSAFE}
_MULTI_LINE = {code: shown for code, shown in _SINGLE_LINE.items() if code not in (0x09, 0x0A)}


def terminal_safe(text: str, *, single_line: bool = False) -> str:
    r"""Return ``text`` with what a terminal would obey instead of show made visible.

    C0 controls (ESC, so every escape sequence: clear-screen, colours, OSC 8 links), DEL,
    C1 controls, Unicode bidi controls and isolates (U+202E reverses what follows it) and
    lone surrogates become escapes an operator can read and see were there: ESC is shown
    as ``\x1b``, U+202E as ``\u202e``, a newline as ``\n``. Newlines and tabs are kept
    unless ``single_line`` (a table cell of ids, a one-line field). Backslashes are left as
    they are: a text that spells an escape out (a literal ``\x1b``) reads the same as one
    that held the character, which is harmless; ``--json`` tells the two apart.

    Args:
        text: what a model, a tool, a caller or an approver chose.
        single_line: escape newlines and tabs too.
    """
    return text.translate(_SINGLE_LINE if single_line else _MULTI_LINE)


def safe_text(text: str, style: str | Style = "") -> Text:
    """Return a ``Text`` of data: terminal-safe (see ``terminal_safe``), never markup.

    Build every ``Text`` of data with it rather than with ``Text(...)``: Rich's ``Text``
    drops BEL, BS, VT, FF and CR silently, so an escape made afterwards could no longer
    show that they were there.
    """
    return Text(terminal_safe(text), style=style)


def _made_safe(text: Text, *, single_line: bool = False) -> Text:
    """Return ``text`` terminal-safe, its styles kept: the last pass, at printing."""
    plain = text.plain
    if terminal_safe(plain, single_line=single_line) == plain:
        return text
    # Cut at every style boundary: each piece is then styled as a whole, and keeps its
    # styles however much longer its escaped text gets.
    cuts = sorted({offset for span in text.spans for offset in (span.start, span.end)})
    safe = text.blank_copy()
    for piece in text.divide(cuts):
        part = Text(terminal_safe(piece.plain, single_line=single_line))
        for span in piece.spans:
            part.stylize(span.style)
        safe.append_text(part)
    return safe


def preview(text: str, width: int = 72) -> str:
    """One line of at most ``width`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "\u2026"


_UNLIMITED = 1_000_000


def id_column(table: Table, header: str, **options: Any) -> None:
    """Add a column for ids: never wrapped or cut (see ``print_table``)."""
    table.add_column(header, no_wrap=True, overflow="ignore", **options)


def _safe_cell(cell: Any, single_line: bool) -> Any:
    if isinstance(cell, Text):
        return _made_safe(cell, single_line=single_line)
    if isinstance(cell, str):  # markup of ours: a str cell holds no data (see above)
        return terminal_safe(cell, single_line=single_line)
    return cell


def _make_safe(table: Table) -> None:
    """Make every cell and the title of ``table`` terminal-safe, in place."""
    table.title = _safe_cell(table.title, single_line=False)
    for column in table.columns:
        # Here rather than in each ``add_row``: no command can forget it. Rich offers the
        # cells read-only (``cells``); ``_cells`` is the list they come from. Columns that
        # do not wrap hold ids and names: one line each, a newline shown as ``\n``.
        column._cells = [_safe_cell(cell, column.no_wrap) for cell in column._cells]


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` at least as wide as its id columns need, wider than the terminal if so.

    Rich fits a table to the console's width (80 columns when the output is a pipe) and, as
    a last resort, cuts every column with an ellipsis; an id cut short is useless to whoever
    copies it into the next command. Text columns wrap first; if the ids alone do not fit,
    the table is printed wider than the console.

    Every cell is made terminal-safe first (``terminal_safe``), whichever command built it.
    """
    _make_safe(table)
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


def print_text(console: Console, text: Text | str) -> None:
    """Print a line that holds data: terminal-safe, never markup, never wrapped by Rich."""
    console.print(_made_safe(safe_text(text) if isinstance(text, str) else text), soft_wrap=True)


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
            safe_text(result.tool_call_id),
            safe_text(result.resolved_tool_name),
            status,
            f"{result.duration_ms:.1f}",
            safe_text(preview(render_text(result.output))),
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
            terminal_safe(
                f" in {action.get('delay_ms')} ms as attempt {payload.get('next_attempt')}{why}"
            ),
        )
    else:
        reason = action.get("reason") or action.get("prompt") or ""
        text = Text.assemble(
            (terminal_safe(str(kind)), "yellow"),
            terminal_safe(f"{why}: {preview(str(reason), 60)}"),
        )
    problem = payload.get("correction_problem")
    if problem:
        text.append(terminal_safe(f"; correction unusable: {problem}"), style="red")
    return text


def _event_detail(event: AuditEvent, full: bool) -> Text:
    payload = event.payload
    if event.kind == "tool_call_received":
        return safe_text(f"input {preview(str(payload.get('input')), 10_000 if full else 60)}")
    if event.kind == "tool_post":
        output = payload.get("output")
        text = output if isinstance(output, str) else str(output)
        shown = text if full else preview(text, 60)
        style = "yellow" if payload.get("is_error") else "green"
        label = "soft error" if payload.get("is_error") else "ok"
        return Text.assemble(
            (label, style), terminal_safe(f" {payload.get('duration', 0):.1f} ms  {shown}")
        )
    if event.kind == "tool_pre":
        return Text("")
    if event.kind == "recovery_decision":
        return _recovery_detail(payload)
    if event.kind == "turn_started":
        return safe_text(f"session {payload.get('session_id')}, {payload.get('calls')} calls")
    if event.kind == "turn_end":
        state = "success" if payload.get("success") else f"failed: {payload.get('error')}"
        return safe_text(
            f"phase {payload.get('phase')}, {state}, {payload.get('duration_ms', 0):.1f} ms"
        )
    if event.kind == "tool_routed":
        return safe_text(f"sent to {payload.get('task_queue')} (a worker there has the tool)")
    if event.kind == "turn_cancelled":
        return safe_text(
            f"finished calls: {', '.join(payload.get('finished_calls', [])) or 'none'}"
        )
    return safe_text(preview(str(payload), 10_000 if full else 80))


def _event_kind(event: AuditEvent) -> Text:
    # Records reconciliation rebuilt from Temporal's history (the turn closed before its
    # first write) say so: what a worker wrote and what was read back differ in what they
    # can tell (no hook decisions, no memory).
    if event.payload.get("rebuilt") is True:
        return Text.assemble(safe_text(event.kind), (" (rebuilt)", "magenta"))
    return safe_text(event.kind)


def timeline_table(events: Sequence[AuditEvent], *, full: bool = False, title: str = "") -> Table:
    """A turn's audit trail as a timeline: one row per event, times relative to the start."""
    table = Table(title=safe_text(title or "Audit timeline"), title_justify="left")
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
            safe_text(event.tool_call_id or ""),
            safe_text(event.tool_name or ""),
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
        "lost": "red",
        "cancelled": "yellow",
        "running": "cyan",
    }
    for turn in turns:
        table.add_row(
            safe_text(turn.turn_id),
            safe_text(turn.session_id),
            safe_text(turn.status, style=styles.get(turn.status, "")),
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


def cost_text(cost_usd: float | None) -> str:
    """An estimated cost, ``$0.0123``, or ``-`` when unpriced."""
    return "-" if cost_usd is None else f"${cost_usd:.4f}"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def model_calls_table(calls: Sequence[ModelCall], *, full: bool = False) -> Table:
    """Every attempt of a turn's model calls: what it cost, or why it failed."""
    table = Table(title="Model calls", title_justify="left")
    for column in ("#", "attempt"):
        table.add_column(column, no_wrap=True, justify="right")
    id_column(table, "model")
    table.add_column("ms", no_wrap=True, justify="right")
    for column in ("in", "cached", "out", "reasoning"):
        table.add_column(column, no_wrap=True, justify="right")
    table.add_column("stop", no_wrap=True)
    table.add_column("cost", no_wrap=True, justify="right")
    table.add_column("error", overflow="fold")
    for call in calls:
        error = f"{call.error_type}: {call.error}" if call.error_type else (call.error or "")
        table.add_row(
            str(call.seq),
            str(call.attempt),
            safe_text(" / ".join(p for p in (call.provider, call.model) if p)),
            f"{call.latency_ms:,}",
            _count(call.input_tokens),
            _count(call.cached_tokens),
            _count(call.output_tokens),
            _count(call.reasoning_tokens),
            safe_text(call.stop_reason or ""),
            cost_text(call.cost_usd),
            safe_text(error if full else preview(error, 100), style="red" if error else ""),
        )
    return table


def model_totals_line(sums: ModelCallTotals) -> str:
    """The totals of some model calls in one line."""
    line = (
        f"{sums.calls} model calls ({sums.failed} failed): {sums.input_tokens:,} in "
        f"({sums.cached_tokens:,} cached), {sums.output_tokens:,} out"
    )
    if sums.reasoning_tokens:
        line += f" ({sums.reasoning_tokens:,} reasoning)"
    line += f", {cost_text(sums.cost_usd)} estimated"
    if sums.unpriced:
        line += f" ({sums.unpriced} calls of models without a price in TOOLTRAIL_MODEL_PRICES)"
    return line
