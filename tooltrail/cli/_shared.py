"""What the command modules share.

The Typer application and its groups, which each command module registers its commands on
(``_app`` mounts the groups and imports the modules); the consoles, the exit statuses, the
one-line error, running a coroutine with Temporal's and tooltrail's errors turned into that
line, the audit store a reading command opens, the Temporal client a command connects, and
``load_host`` (``--tools MODULE:ATTR``).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text
from temporalio.service import RPCError, RPCStatusCode

from tooltrail.errors import ConfigurationError, TooltrailError
from tooltrail.settings import Settings

if TYPE_CHECKING:
    from tooltrail.pipeline.host import Host

__all__ = [
    "EXIT_ERROR",
    "EXIT_FOUND",
    "CommandError",
    "app",
    "approvers_app",
    "audit_app",
    "console",
    "db_app",
    "error_line",
    "errors",
    "fail",
    "history_app",
    "load_host",
    "resolve_database_url",
    "rpc_error_text",
    "run_command",
    "shown_url",
    "temporal_client",
    "with_store",
]

EXIT_ERROR = 1
"""Exit status of an error: one line on stderr says what is wrong and what to do."""

console = Console()
errors = Console(stderr=True)
T = TypeVar("T")


class CommandError(TooltrailError):
    """Raised by a command for an everyday mistake; its text is the one line printed."""


def error_line(message: str) -> None:
    """Print ``error: MESSAGE`` on stderr, as text (never markup)."""
    from tooltrail.cli.render import terminal_safe

    # Text, not markup, and terminal-safe: the message quotes ids and names a model or a
    # caller chose.
    errors.print(
        Text("error: ", style="red") + Text(terminal_safe(message)),
        soft_wrap=True,
        highlight=False,
    )


def fail(message: str) -> typer.Exit:
    """Print the one-line error; return the exit to raise."""
    error_line(message)
    return typer.Exit(EXIT_ERROR)


def rpc_error_text(exc: RPCError, what: str = "workflow") -> str:
    """Say in one line what a Temporal RPC error means for the command's user."""
    message = exc.message
    if exc.status == RPCStatusCode.NOT_FOUND and "already completed" in message:
        return f"the {what} has already finished; there is nothing left to answer"
    if exc.status == RPCStatusCode.NOT_FOUND:
        return (
            f"the Temporal server has no such {what} ({message}); check the id "
            "(`tooltrail audit list` shows recent turns) and --temporal-address / --namespace"
        )
    if exc.status == RPCStatusCode.UNAVAILABLE:
        return f"Temporal is unavailable ({message}); check --temporal-address"
    return f"Temporal refused the request: {message} ({exc.status.name})"


def run_command(coro: Awaitable[T]) -> T:
    """Run a command's coroutine; tooltrail's and Temporal's errors become the one line."""
    try:
        return asyncio.run(coro)  # type: ignore[arg-type]
    except TooltrailError as exc:
        raise fail(str(exc)) from exc
    except RPCError as exc:
        raise fail(rpc_error_text(exc)) from exc


def resolve_database_url(option: str | None) -> str:
    """The database URL: the option, else the settings' effective URL."""
    return option or Settings().effective_database_url()


def shown_url(url: str) -> str:
    """A database URL as the terminal may show it: without its password."""
    from tooltrail.settings import mask_url

    return mask_url(url)


async def with_store(url: str, fn: Callable[[Any], Awaitable[T]]) -> T:
    """Check the schema, open the audit store, run ``fn`` with it and close it."""
    from tooltrail.db.migrate import open_store

    store = await open_store(url)
    try:
        return await fn(store)
    finally:
        await store.close()


EXIT_FOUND = 3
"""Exit status of a check that found something (differences, stuck turns, a database behind)."""

app = typer.Typer(
    help="tooltrail: durable, auditable tool calls for LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
audit_app = typer.Typer(help="Read the audit trail.", no_args_is_help=True)
db_app = typer.Typer(help="Manage the audit database.", no_args_is_help=True)
history_app = typer.Typer(help="Export workflow histories.", no_args_is_help=True)
approvers_app = typer.Typer(help="Approvers who sign approvals.", no_args_is_help=True)


def load_host(spec: str) -> Host:
    """Import ``MODULE:ATTR`` and return it as a ``Host``.

    Raises:
        ConfigurationError: the path cannot be imported or names something else.
    """
    from tooltrail.pipeline.host import Host
    from tooltrail.tools import Tool, ToolRegistry

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"--tools {spec!r} must look like MODULE:ATTR")
    # Tools modules usually live in the directory the command runs from.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r} for --tools: {exc}") from exc
    try:
        value = getattr(module, attr)
    except AttributeError as exc:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from exc
    if isinstance(value, Host):
        return value
    if isinstance(value, ToolRegistry):
        return Host(value)
    if isinstance(value, Tool):
        return Host([value])
    if isinstance(value, list | tuple) and all(isinstance(item, Tool) for item in value):
        return Host(value)
    raise ConfigurationError(
        f"{spec!r} is a {type(value).__name__}; expected a Host, a ToolRegistry or a list of tools"
    )


def _client_options() -> tuple[str, str]:
    settings = Settings()
    return settings.temporal_address, settings.namespace


async def temporal_client(temporal_address: str | None) -> Any:
    """A Temporal client of the settings' namespace, at ``temporal_address`` (default: theirs)."""
    from tooltrail.runtime.worker import connect_client, settings_client_options

    address, namespace = _client_options()
    return await connect_client(
        temporal_address or address,
        namespace=namespace,
        **settings_client_options(Settings()),
    )
