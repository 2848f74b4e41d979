"""``tooltrail config``: inspect the effective settings, with every secret masked.

The CLI mounts ``config_app`` with ``app.add_typer(config_app, name="config")``.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tooltrail.cli.render import print_json
from tooltrail.settings import Settings

__all__ = ["config_app"]

config_app = typer.Typer(
    help="Inspect tooltrail's settings (TOOLTRAIL_* variables and .env).",
    no_args_is_help=True,
)


@config_app.callback()
def _group() -> None:
    """Inspect tooltrail's settings (TOOLTRAIL_* variables and .env)."""
    # A callback keeps ``config`` a group: Typer runs a one-command app as that command,
    # so ``config show`` would otherwise read "show" as an unexpected argument.


def _sources(settings: Settings) -> dict[str, str]:
    """Say where each field's value came from: ``env``, ``.env`` or ``default``.

    pydantic-settings does not record this; an explicitly set field that is not in the
    environment can only have come from the ``.env`` file, since ``show`` passes no values.
    """
    prefix = (settings.model_config.get("env_prefix") or "").upper()
    environment = {key.upper() for key in os.environ}
    sources = {}
    for name in type(settings).model_fields:
        if f"{prefix}{name.upper()}" in environment:
            sources[name] = "env"
        elif name in settings.model_fields_set:
            sources[name] = ".env"
        else:
            sources[name] = "default"
    return sources


@config_app.command("show")
def show(
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Print the effective settings; secrets show as **** or (unset)."""
    console = Console()
    try:
        settings = Settings()
    except ValidationError as exc:
        # hide_input_in_errors keeps the rejected values (maybe secrets) out of the text.
        Console(stderr=True).print(Text("invalid settings: ", style="red") + Text(str(exc)))
        raise typer.Exit(2) from None
    values = settings.masked()
    if json_output:
        print_json(console, values)
        return
    sources = _sources(settings)
    table = Table(title="tooltrail settings")
    table.add_column("setting")
    table.add_column("value", overflow="fold")
    table.add_column("source")
    for name, value in values.items():
        shown = "" if value is None else str(value)
        # Text, not markup: a value such as "[x]" must print as it is.
        table.add_row(Text(name), Text(shown), Text(sources.get(name, "derived")))
    console.print(table)
