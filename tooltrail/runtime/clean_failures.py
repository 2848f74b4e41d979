"""What leaves an activity as a failure: database errors without the data they were writing.

An exception that fails an activity travels into Temporal: its message and stack trace are
in the activity's failure event, in the workflow's failure when the turn gives up, and in
the soft result the model reads when a tool attempt's infrastructure retries run out. A
database error's text is not safe there: SQLAlchemy's ``StatementError`` lists the
statement's parameters (tool inputs and outputs, audit payloads), and drivers quote values
in their own messages (asyncpg: ``invalid input for query argument $1: '<value>'``;
PostgreSQL: whatever a trigger or constraint says).

So two things hold together: the engines are created with ``hide_parameters=True``
(``tooltrail.db.engine``), and ``CleanDatabaseErrors``, an activity interceptor every worker
installs, replaces a database error leaving any activity (or an ``ApplicationError`` raised
on top of one) with an ``ApplicationError`` that names only the error's classes and SQLSTATE.
The whole error is logged on the worker, where the audit database's own data lives anyway.
The replacement keeps the original's retry verdict, so Temporal retries what it retried.
"""

from __future__ import annotations

import logging
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

__all__ = ["CleanDatabaseErrors", "clean_database_error", "database_error_in"]

log = logging.getLogger("tooltrail.failures")

DATABASE_ERROR = "DatabaseError"
"""The ``ApplicationError.type`` of a cleaned database error without a type of its own."""

# Exceptions from these packages are database errors (SQLAlchemy wraps the drivers' errors,
# but a driver's own may surface unwrapped, e.g. raised inside a connection's setup).
_DATABASE_PACKAGES = ("sqlalchemy", "asyncpg", "sqlite3", "aiosqlite", "psycopg")
_CHAIN_LIMIT = 20


def _is_database_error(exc: BaseException) -> bool:
    module = type(exc).__module__.partition(".")[0]
    return module in _DATABASE_PACKAGES and isinstance(exc, Exception)


def database_error_in(exc: BaseException) -> BaseException | None:
    """Return the first database error in ``exc``'s chain (itself, its causes), or ``None``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < _CHAIN_LIMIT:
        seen.add(id(current))
        if _is_database_error(current):
            return current
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return None


def _sqlstate(error: BaseException) -> str | None:
    for candidate in (error, getattr(error, "orig", None)):
        while candidate is not None:
            for name in ("sqlstate", "pgcode"):
                code = getattr(candidate, name, None)
                if isinstance(code, str) and code:
                    return code
            candidate = candidate.__cause__
    return None


def _classes(error: BaseException) -> str:
    """``IntegrityError (UniqueViolationError)``: the error's class and its driver's."""
    names = [type(error).__name__]
    driver: Any = getattr(error, "orig", None)
    while driver is not None and len(names) < 4:
        name = type(driver).__name__
        if name not in names:
            names.append(name)
        driver = driver.__cause__
    head, *rest = names
    return f"{head} ({', '.join(rest)})" if rest else head


def clean_database_error(exc: BaseException, *, where: str) -> ApplicationError | None:
    """Return a clean stand-in for ``exc`` if a database error is in its chain, else ``None``.

    Args:
        exc: the exception leaving an activity.
        where: what failed (the activity type), for the message.

    Returns:
        An ``ApplicationError`` naming the error's classes and SQLSTATE, never its text, with
        ``exc``'s type and retry verdict when it is an ``ApplicationError`` itself.
    """
    found = database_error_in(exc)
    if found is None:
        return None
    code = _sqlstate(found)
    message = (
        f"database error in {where}: {_classes(found)}"
        + (f", SQLSTATE {code}" if code else "")
        + " (its text stays in the worker's log: it may quote the data being written)"
    )
    if isinstance(exc, ApplicationError):
        return ApplicationError(
            message,
            type=exc.type,
            non_retryable=exc.non_retryable,
            next_retry_delay=exc.next_retry_delay,
        )
    return ApplicationError(message, type=type(found).__name__ or DATABASE_ERROR)


class _CleanInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except Exception as exc:
            where = activity.info().activity_type
            clean = clean_database_error(exc, where=where)
            if clean is None:
                raise
            log.warning("%s failed with a database error", where, exc_info=True)
            # ``from None``: the failure converter would otherwise carry the original
            # exception (and its text) along as the failure's cause.
            raise clean from None


class CleanDatabaseErrors(Interceptor):
    """Worker interceptor: database errors leave activities without their text (see module)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        """Wrap every activity of the worker."""
        return _CleanInbound(next)
