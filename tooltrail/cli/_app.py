"""The ``tooltrail`` command line: ``main``, and the app with every command group mounted.

The commands live in one module per group (``serve``, ``audit``, ``approvals``,
``histories``, ``reruns``, ``database``, ``agent_runs``, ``config``), each registering on the
app and groups of ``_shared``; importing this module imports them all.

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

import logging
import os
import sys

from rich.text import Text
from temporalio.service import RPCError

# The command modules register their commands on ``app`` and its groups when imported; they
# are imported in the order ``tooltrail --help`` lists the commands.
# isort: off
import tooltrail.cli.serve
import tooltrail.cli.audit
import tooltrail.cli.approvals
import tooltrail.cli.histories
import tooltrail.cli.reruns
import tooltrail.cli.database  # noqa: F401

# isort: on
from tooltrail.cli._shared import (
    EXIT_ERROR,
    EXIT_FOUND,
    app,
    approvers_app,
    audit_app,
    db_app,
    error_line,
    errors,
    history_app,
    load_host,
    rpc_error_text,
)
from tooltrail.cli.agent_runs import cancel_command, fork_command
from tooltrail.cli.config import config_app
from tooltrail.cli.render import send_json_to
from tooltrail.errors import TooltrailError

__all__ = ["EXIT_ERROR", "EXIT_FOUND", "app", "load_host", "main"]

app.add_typer(audit_app, name="audit")
app.add_typer(db_app, name="db")
app.add_typer(history_app, name="history")
app.add_typer(config_app, name="config")
app.add_typer(approvers_app, name="approvers")
# In their own module, with ``audit show RUN`` and ``run`` on a cluster.
app.command("cancel")(cancel_command)
app.command("fork")(fork_command)


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


if __name__ == "__main__":  # pragma: no cover - `python -m tooltrail.cli` uses __main__.py
    main()
