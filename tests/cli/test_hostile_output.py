"""Text a model or a tool chose never reaches the operator's terminal as control text.

A tool output, an argument, a call id, a tool name, a hook's question or an approver's name
can hold escape sequences (clear the screen, recolour what follows, an OSC 8 link that hides
its address behind other words) and bidi overrides (U+202E shows what follows reversed).
``audit list``, ``audit show`` and ``approvals`` print them as visible escapes
(``tooltrail.cli.render.terminal_safe``); ``--json`` keeps the data as it was.

The commands run as real subprocesses (their stdout is a pipe, so Rich adds no escape
sequences of its own: every ESC in it would be the data's) against turns recorded through
the real Temporal dev server; the workers run in the test process.
"""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text
from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tests.support.cli_runner import run_cli
from tooltrail import Allow, Ask, Host, PreToolUseContext, RunConfig, ToolCall, tool
from tooltrail.cli.render import id_column, print_table, print_text, safe_text, terminal_safe

CLEAR_AND_RED = "\x1b[2J\x1b[31m"
LINK = "\x1b]8;;http://evil\x07click\x1b]8;;\x07"
HOSTILE = f"{CLEAR_AND_RED}{LINK}\u202e"
"""Clear the screen, turn red, a link to http://evil that reads "click", reverse the rest."""
SHOWN = ("\\x1b[2J\\x1b[31m", "\\x1b]8;;http://evil\\x07click\\x1b]8;;\\x07", "\\u202e")
"""How ``HOSTILE`` reads on the terminal, piece by piece."""
RAW = ("\x1b", "\x07", "\u202e", "\x9b")
"""What must never reach the terminal (ESC, BEL, RLO, a C1 CSI)."""


@tool
def shout(text: str) -> str:
    """Answer with the text, and a C1 CSI (one byte that some terminals obey as ESC [)."""
    return f"{text}\x9b2J done"


class AskFirst:
    """Asks a human before every ``shout``, quoting what it would say."""

    async def pre_tool(self, ctx: PreToolUseContext) -> Any:
        """Ask with the model's text in the question."""
        if ctx.tool_name == "shout":
            return Ask(f"say {ctx.input.get('text')}?")
        return Allow()


async def cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run the command in a thread, so the worker of this process keeps working meanwhile.

    Wide enough that no cell folds an escaped text across lines.
    """
    return await asyncio.to_thread(run_cli, args, tmp_path, COLUMNS="1000")


def assert_terminal_safe(done: subprocess.CompletedProcess[str], *shown: str) -> None:
    for stream in (done.stdout, done.stderr):
        for raw in RAW:
            assert raw not in stream, (raw, stream)
    for text in shown:
        assert text in done.stdout, (text, done.stdout)


def address_of(env: WorkflowEnvironment) -> str:
    return str(env.client.service_client.config.target_host)


# -- the function ------------------------------------------------------------------------------


def test_terminal_safe_shows_controls_escapes_and_bidi_as_escapes() -> None:
    assert terminal_safe(HOSTILE) == "".join(SHOWN)
    controls = "".join(map(chr, [*range(0x20), 0x7F, *range(0x80, 0xA0)]))
    bidi = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    for text in (controls, bidi, "\ud800"):
        shown = terminal_safe(text, single_line=True)
        assert shown.isascii() and shown.isprintable(), shown
    assert terminal_safe("\x00\x08\x0d\x7f\x85\x9b") == "\\x00\\x08\\r\\x7f\\x85\\x9b"
    assert terminal_safe("\u2066x\u2069\u061c") == "\\u2066x\\u2069\\u061c"
    # Newlines and tabs: kept in text, shown in a single-line field.
    assert terminal_safe("a\tb\nc") == "a\tb\nc"
    assert terminal_safe("a\tb\nc", single_line=True) == "a\\tb\\nc"
    # Everything else is left as it is: text of any script, emoji with their joiners.
    plain = "ok [red]not red[/] é 名前 \u05e9\u05dc\u05d5\u05dd 👩\u200d💻 \\x1b 100%"
    assert terminal_safe(plain, single_line=True) == plain


def test_safe_text_print_text_and_print_table_print_data_as_escapes() -> None:
    # Why the escaping is ours: Rich prints ESC and RLO as they are, and drops BEL silently
    # (so safe_text escapes before a Text is made).
    out = io.StringIO()
    Console(file=out, color_system=None).print(Text(HOSTILE))
    assert "\x1b[2J" in out.getvalue() and "\u202e" in out.getvalue()
    assert "\x07" not in out.getvalue()
    assert safe_text(HOSTILE, style="bold").plain == "".join(SHOWN), "BEL shown, not dropped"

    out = io.StringIO()
    console = Console(file=out, width=80, color_system="standard", force_terminal=True)
    # A line built without safe_text: the last pass still escapes it, its styles kept.
    print_text(console, Text("ok", style="green") + Text(f" {CLEAR_AND_RED} ", style="bold"))
    assert out.getvalue() == "\x1b[32mok\x1b[0m\x1b[1;32m \\x1b[2J\\x1b[31m \x1b[0m\n"

    table = Table(title=Text(f"turn {HOSTILE}"))
    id_column(table, "call")
    table.add_column("output")
    table.add_row(safe_text(f"c1\n{HOSTILE}"), Text(f"line one\n{HOSTILE}"))
    out = io.StringIO()
    print_table(Console(file=out, width=80, color_system=None), table)
    printed = out.getvalue()
    assert not any(raw in printed for raw in RAW), printed
    assert "c1\\n\\x1b[2J" in printed, "an id stays on one line, its newline shown"
    assert "line one" in printed and "\\u202e" in printed, printed


# -- the commands ------------------------------------------------------------------------------


async def test_audit_list_and_show_print_a_hostile_turn_as_escapes(
    stack: StackFactory, sqlite_url: str, tmp_path: Path
) -> None:
    session = f"s-{HOSTILE}"
    turn_id = f"turn-hostile-{uuid.uuid4()}"
    async with stack(Host([shout])) as tt:
        output = await tt.run_turn(
            [
                ToolCall(f"c1{HOSTILE}", "shout", {"text": HOSTILE}),
                ToolCall("c2", f"nope\n{HOSTILE}", {"x": HOSTILE}),
            ],
            session_id=session,
            turn_id=turn_id,
        )
    assert output.results[0].output == f"{HOSTILE}\x9b2J done"
    database = ["--database-url", sqlite_url]

    listed = await cli(["audit", "list", *database], tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert_terminal_safe(listed, turn_id, "s-" + "".join(SHOWN))

    for full in ([], ["--full"]):
        shown = await cli(["audit", "show", turn_id, *full, *database], tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert_terminal_safe(
            shown,
            f"c1{SHOWN[0]}",  # the call id
            "nope\\n" + SHOWN[0],  # the unknown tool's name, on one line
            *SHOWN,  # the argument and the output
            "\\x9b2J done",
        )

    # JSON is for machines: the data exactly as it was recorded.
    as_json = await cli(["audit", "show", turn_id, "--json", *database], tmp_path)
    events = json.loads(as_json.stdout)["events"]
    assert any(e["tool_call_id"] == f"c1{HOSTILE}" for e in events)
    assert json.loads(as_json.stdout)["turn"]["session_id"] == session


async def test_approvals_print_hostile_questions_ids_and_approvers_as_escapes(
    stack: StackFactory, temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    address = ["--temporal-address", address_of(temporal_env)]
    call_id = f"a1{HOSTILE}"
    config = RunConfig(interactive=True, approval_timeout_s=900)
    async with stack(Host([shout], hooks=[AskFirst()])) as tt:
        turn = await tt.start_turn(
            [ToolCall(call_id, "shout", {"text": HOSTILE})], session_id="ops", config=config
        )
        for _ in range(200):
            if await turn.pending_approvals():
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the call never asked")

        for which in (["--all"], [turn.turn_id]):
            waiting = await cli(["approvals", *which, *address], tmp_path)
            assert waiting.returncode == 0, waiting.stderr
            assert_terminal_safe(waiting, turn.turn_id, f"a1{SHOWN[0]}", "say " + SHOWN[0], *SHOWN)

        answer = ["--reason", HOSTILE, "--by", f"ops{HOSTILE}", *address]
        denied = await cli(["deny", turn.turn_id, call_id, *answer], tmp_path)
        assert denied.returncode == 0, denied.stderr
        assert_terminal_safe(denied, f"denied a1{SHOWN[0]}")
        assert (await turn.result()).results[0].output == HOSTILE

    history = await cli(
        ["approvals", "history", turn.turn_id, "--database-url", sqlite_url], tmp_path
    )
    assert history.returncode == 0, history.stderr
    assert_terminal_safe(history, f"a1{SHOWN[0]}", f"ops{SHOWN[0]}", *SHOWN)

    # The one error line too: Temporal's own message quotes the id as it was given.
    unknown = await cli(["approvals", f"nope{HOSTILE}", *address], tmp_path)
    assert unknown.returncode == 1
    assert_terminal_safe(unknown)
    assert SHOWN[0] in unknown.stderr, unknown.stderr
