"""What the command modules share.

The consoles, the one-line error,
running a coroutine with Temporal's and tooltrail's errors turned into that line, and the
audit store a reading command opens.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text
from temporalio.service import RPCError, RPCStatusCode

from tooltrail.errors import TooltrailError
from tooltrail.settings import Settings

__all__ = [
    "EXIT_ERROR",
    "CommandError",
    "console",
    "error_line",
    "errors",
    "fail",
    "resolve_database_url",
    "rpc_error_text",
    "run_command",
    "shown_url",
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
    # Text, not markup: the message quotes ids and names a model or a caller chose.
    errors.print(Text("error: ", style="red") + Text(message), soft_wrap=True, highlight=False)


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
