"""Running the Alembic migrations from code (the CLI, the embedded stack and the tests).

The engine is async, so the migrations run on a sync connection handed over through
``config.attributes["connection"]`` (Alembic's cookbook pattern); ``migrations/env.py`` uses
that connection when present and opens its own otherwise (the ``alembic`` command).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, make_url

from tooltrail.db.engine import create_engine, normalize_url

if TYPE_CHECKING:
    from tooltrail.db.store import AuditStore
from tooltrail.errors import DatabaseSchemaError

__all__ = [
    "alembic_config",
    "check_schema",
    "head_revision",
    "migrations_dir",
    "open_store",
    "upgrade",
]


def migrations_dir() -> Path:
    """Return the Alembic script directory (packaged in a wheel, or the repository's)."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "_migrations", here.parent.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise DatabaseSchemaError("tooltrail's migrations are missing from this installation")


def alembic_config(url: str | None = None) -> Config:
    """Return an Alembic config pointing at tooltrail's migrations (and ``url``, if given)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if url is not None:
        rendered = normalize_url(url).render_as_string(hide_password=False)
        cfg.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    """Return the newest migration's revision id."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise DatabaseSchemaError("tooltrail's migrations have no head revision")
    return head


async def _run_with_connection(url: str, fn: Any, *args: Any) -> Any:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            return await conn.run_sync(fn, *args)
    finally:
        await engine.dispose()


async def upgrade(url: str, revision: str = "head") -> None:
    """Apply the migrations to the database at ``url`` up to ``revision``."""

    def run(connection: Connection) -> None:
        cfg = alembic_config(url)
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)

    await _run_with_connection(url, run)


async def current_revision(url: str) -> str | None:
    """Return the database's current revision, or ``None`` for an empty database."""

    def read(connection: Connection) -> str | None:
        return MigrationContext.configure(connection).get_current_revision()

    result: str | None = await _run_with_connection(url, read)
    return result


async def check_schema(url: str) -> None:
    """Check that the database is at the migrations' head.

    Raises:
        DatabaseSchemaError: with the command that fixes it.
    """
    _require_head(url, await current_revision(url))


def _require_head(url: str, current: str | None) -> None:
    head = head_revision()
    if current != head:
        shown = make_url(url).render_as_string(hide_password=True)
        state = "has no tooltrail schema" if current is None else f"is at revision {current!r}"
        raise DatabaseSchemaError(
            f"the audit database {shown!r} {state}, but this tooltrail needs revision "
            f"{head!r}: run `tooltrail db upgrade --database-url {shown}` first"
        )


async def open_store(url: str, *, migrate: bool = False, **engine_options: Any) -> AuditStore:
    """Open the audit store at ``url`` once its schema is at the migrations' head.

    The check (or the upgrade) runs on the store's own engine: one engine, one pool, for the
    command or worker that reads and writes next.

    Args:
        url: the database URL.
        migrate: upgrade the database to the head instead of checking it.
        **engine_options: for the engine (``pool_size``, ...).

    Raises:
        DatabaseSchemaError: the database is not at the head (and not ``migrate``).
    """
    from tooltrail.db.store import AuditStore

    store = AuditStore(url, **engine_options)
    try:
        async with store.engine.begin() as connection:
            if migrate:

                def run(sync: Connection) -> None:
                    cfg = alembic_config(url)
                    cfg.attributes["connection"] = sync
                    command.upgrade(cfg, "head")

                await connection.run_sync(run)
            else:
                current = await connection.run_sync(
                    lambda sync: MigrationContext.configure(sync).get_current_revision()
                )
                _require_head(url, current)
    except BaseException:
        await store.close()
        raise
    return store
