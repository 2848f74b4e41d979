"""``tooltrail db``: ``upgrade`` the audit database and show its ``current`` revision."""

from __future__ import annotations

from typing import Annotated

import typer

from tooltrail.cli._shared import (
    EXIT_FOUND,
    console,
    db_app,
    errors,
    resolve_database_url,
    run_command,
)
from tooltrail.cli.options import DatabaseOption, JsonOption
from tooltrail.cli.render import print_json

__all__ = ["db_current", "db_upgrade"]


@db_app.command("upgrade")
def db_upgrade(
    database_url: DatabaseOption = None,
    revision: Annotated[str, typer.Option(help="Target revision.")] = "head",
) -> None:
    """Apply the migrations to the audit database."""
    from tooltrail.db.migrate import current_revision, upgrade

    url = resolve_database_url(database_url)
    run_command(upgrade(url, revision))
    console.print(f"database at revision {run_command(current_revision(url))}")


@db_app.command("current")
def db_current(database_url: DatabaseOption = None, json_output: JsonOption = False) -> None:
    """Print the audit database's revision and the code's head; exit 3 when it is behind."""
    from tooltrail.db.migrate import current_revision, head_revision

    current = run_command(current_revision(resolve_database_url(database_url)))
    head = head_revision()
    if json_output:
        print_json(console, {"current": current, "head": head, "up_to_date": current == head})
    else:
        console.print(f"current: {current}\nhead:    {head}")
        if current != head:
            errors.print("the database is not at the code's head: run `tooltrail db upgrade`")
    if current != head:
        raise typer.Exit(EXIT_FOUND)
