"""Alembic environment for tooltrail's audit database.

Run from code (``tooltrail db upgrade``), a sync connection arrives in
``config.attributes["connection"]``. Run as ``alembic upgrade head`` from the repository, the
URL comes from ``-x url=...``, ``sqlalchemy.url`` or the ``TOOLTRAIL_DATABASE_URL`` setting.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from tooltrail.db.engine import create_engine
from tooltrail.db.orm import Base
from tooltrail.settings import Settings

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str:
    return (
        context.get_x_argument(as_dictionary=True).get("url")
        or config.get_main_option("sqlalchemy.url")
        or Settings().effective_database_url()
    )


async def _run_async() -> None:
    engine = create_engine(_url())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_configure)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif (connection := config.attributes.get("connection")) is not None:
    _configure(connection)
else:
    asyncio.run(_run_async())
