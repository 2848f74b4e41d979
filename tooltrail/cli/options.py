"""The command line's shared options: one definition each, for every module of commands.

Every command module of ``tooltrail.cli`` takes these; one definition each keeps their
flags, environment variables and help texts the same everywhere.
"""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = [
    "AddressOption",
    "DatabaseOption",
    "JsonOption",
    "NamespaceOption",
    "TaskQueueOption",
    "ToolsOption",
]

DatabaseOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="TOOLTRAIL_DATABASE_URL",
        help="Audit database URL (default: the embedded SQLite file).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
AddressOption = Annotated[
    str | None, typer.Option(envvar="TOOLTRAIL_TEMPORAL_ADDRESS", help="HOST:PORT")
]
TaskQueueOption = Annotated[
    str | None,
    typer.Option(envvar="TOOLTRAIL_TASK_QUEUE", help="The workers' task queue."),
]
NamespaceOption = Annotated[
    str | None, typer.Option(envvar="TOOLTRAIL_NAMESPACE", help="Temporal namespace.")
]
ToolsOption = Annotated[
    str,
    typer.Option(
        "--tools",
        envvar="TOOLTRAIL_TOOLS",
        help="MODULE:ATTR naming a Host, a ToolRegistry or a list of tools.",
    ),
]
