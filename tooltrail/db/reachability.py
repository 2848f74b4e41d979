"""Tell a database that could not be reached from one that refused what it was given."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from tooltrail.tools.idempotency import IdempotencyStoreUnavailable

__all__ = ["unreachable"]


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be reached (rather than refusing a value).

    SQLAlchemy's ``OperationalError``/``InterfaceError`` and invalidated connections, the
    socket errors under them (asyncpg raises ``OSError`` unwrapped while connecting),
    timeouts, and tooltrail's ``IdempotencyStoreUnavailable``. Retrying anything else (a
    value the database refuses) would fail the same way forever.
    """
    if isinstance(exc, OperationalError | InterfaceError | IdempotencyStoreUnavailable):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OSError | TimeoutError)
