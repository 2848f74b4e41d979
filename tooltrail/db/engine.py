"""Database URLs and engines.

Users may give plain URLs (``sqlite:///x.db``, ``postgresql://u@h/db``) or URLs with a
driver; tooltrail always talks through its async drivers (aiosqlite, asyncpg).

Each engine keeps a connection pool sized by the settings (``TOOLTRAIL_DB_POOL_SIZE``,
``TOOLTRAIL_DB_MAX_OVERFLOW``, ``TOOLTRAIL_DB_POOL_TIMEOUT_S``; 5 + 10 and 30 s by default,
SQLAlchemy's own defaults); keyword arguments given to ``create_engine`` win.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from tooltrail.errors import ConfigurationError
from tooltrail.settings import Settings

__all__ = ["create_engine", "normalize_url", "pool_options", "session_factory"]

_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg"}


def normalize_url(url: str | URL) -> URL:
    """Return the URL with tooltrail's async driver.

    Raises:
        ConfigurationError: the database is neither SQLite nor PostgreSQL.
    """
    parsed = make_url(url) if isinstance(url, str) else url
    backend = parsed.get_backend_name()
    if backend == "postgres":
        backend = "postgresql"
    if backend not in _DRIVERS:
        raise ConfigurationError(
            f"unsupported database URL {parsed.render_as_string(hide_password=True)!r}: "
            "use sqlite:///path.db or postgresql://user@host/db"
        )
    return parsed.set(drivername=_DRIVERS[backend])


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets readers (audit queries, the CLI) run while a worker writes; the busy timeout
    # makes concurrent writers of one file wait instead of failing at once.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    # WAL + NORMAL: no fsync per commit; a process crash loses nothing committed (only an
    # OS crash or power loss can drop the last transactions). Audit writes are frequent.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def pool_options() -> dict[str, Any]:
    """Return the pool size, overflow and timeout from the settings.

    Settings that do not validate (a malformed secret, say) leave SQLAlchemy's defaults: that
    error is reported where the setting is used, not by every database connection.
    """
    try:
        return Settings().pool_options()
    except ValidationError:
        return {}


def _in_memory(database: str | None) -> bool:
    return not database or database == ":memory:" or "mode=memory" in database


def create_engine(url: str | URL, **kwargs: Any) -> AsyncEngine:
    """Create an async engine for a tooltrail database; creates a SQLite file's directory.

    Statement errors never list their parameters (tool inputs and outputs): their text can
    travel into Temporal failures and logs (see ``tooltrail.runtime.clean_failures``).
    """
    kwargs.setdefault("hide_parameters", True)
    normalized = normalize_url(url)
    if normalized.get_backend_name() == "sqlite":
        database = normalized.database
        if not _in_memory(database):
            # An in-memory database has a single static connection: no pool to size.
            kwargs = {**pool_options(), **kwargs}
        if database and database != ":memory:" and not database.startswith("file:"):
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(normalized, **kwargs)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    kwargs = {"pool_pre_ping": True, **pool_options(), **kwargs}
    return create_async_engine(normalized, **kwargs)


def session_factory(engine: AsyncEngine) -> async_sessionmaker[Any]:
    """Return the session factory used by every data-layer function."""
    return async_sessionmaker(engine, expire_on_commit=False)
