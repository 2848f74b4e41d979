"""``open_deployment``: the one setup behind ``tooltrail.connect``, ``tooltrail.local`` and
``tooltrail.runtime.worker`` (settings, database URL, schema, Temporal client, audit store).

The end-to-end paths through it run elsewhere: ``tooltrail.runtime.worker`` (the CLI's worker) and
``tooltrail.connect`` in tests/cli/test_cli.py, ``tooltrail.local`` in tests/test_layers.py and the
demo. Here: its order (a bad database fails before anything connects) and its defaults.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tooltrail import DatabaseSchemaError, Host, tool
from tooltrail.db.migrate import check_schema
from tooltrail.runtime.worker import open_deployment
from tooltrail.settings import Settings


@tool
def echo(text: str) -> str:
    """Echo the text back."""
    return text


class Factory:
    """A client factory that hands out the shared server's client and remembers its calls."""

    def __init__(self, env: WorkflowEnvironment) -> None:
        self.env = env
        self.settings: list[Settings] = []

    async def __call__(self, settings: Settings) -> Client:
        self.settings.append(settings)
        return self.env.client


@pytest.fixture(autouse=True)
def no_dotenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Settings read a .env file of the working directory: none here.
    monkeypatch.chdir(tmp_path)
    for name in ("TEMPORAL_ADDRESS", "NAMESPACE", "TASK_QUEUE", "DATABASE_URL"):
        monkeypatch.delenv(f"TOOLTRAIL_{name}", raising=False)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def postgres_or_none(request: pytest.FixtureRequest) -> str | None:
    """``None`` for SQLite; for PostgreSQL the session's database (skips loudly without one)."""
    if request.param == "sqlite":
        return None
    return str(request.getfixturevalue("postgres_server_url"))


@pytest.fixture
async def empty_db_url(postgres_or_none: str | None, tmp_path: Path) -> AsyncIterator[str]:
    """A database with no tooltrail schema: a fresh SQLite file, or a fresh PostgreSQL one."""
    if postgres_or_none is None:
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    name = f"tooltrail_deploy_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres_or_none)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield f"{postgres_or_none.rpartition('/')[0]}/{name}"
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def test_a_database_behind_the_migrations_fails_before_anything_connects(
    empty_db_url: str, temporal_env: WorkflowEnvironment
) -> None:
    factory = Factory(temporal_env)
    with pytest.raises(DatabaseSchemaError, match="tooltrail db upgrade"):
        async with open_deployment(Host([echo]), database_url=empty_db_url, client=factory):
            pytest.fail("opened a deployment on a database without the schema")
    assert factory.settings == [], "no client was made"


async def test_migrate_upgrades_the_database_first(
    empty_db_url: str, temporal_env: WorkflowEnvironment
) -> None:
    factory = Factory(temporal_env)
    async with open_deployment(
        Host([echo]), database_url=empty_db_url, migrate=True, client=factory
    ) as deployment:
        assert deployment.client is temporal_env.client
        async with deployment.store.sessions() as session:
            assert (await session.execute(text("SELECT count(*) FROM turn"))).scalar() == 0
    assert len(factory.settings) == 1
    await check_schema(empty_db_url)


async def test_options_come_from_the_call_then_the_host_then_the_settings(
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    temporal_env: WorkflowEnvironment,
) -> None:
    other = f"sqlite:///{tmp_path / 'from-settings.db'}"
    monkeypatch.setenv("TOOLTRAIL_DATABASE_URL", other)
    monkeypatch.setenv("TOOLTRAIL_TASK_QUEUE", "queue-from-settings")
    monkeypatch.setenv("TOOLTRAIL_TEMPORAL_ADDRESS", "temporal.invalid:7233")
    factory = Factory(temporal_env)

    async with open_deployment(
        Host([echo], database_url=sqlite_url), migrate=True, client=factory
    ) as deployment:
        assert deployment.store.url == sqlite_url, "the host's database wins over the settings'"
        assert deployment.task_queue == "queue-from-settings"
        assert deployment.host.registry.names() == ["echo"]
        assert deployment.settings.temporal_address == "temporal.invalid:7233"
    assert factory.settings == [deployment.settings]

    async with open_deployment([echo], migrate=True, client=factory) as deployment:
        assert deployment.store.url == other, "no URL given: the settings'"
    async with open_deployment(
        Host([echo], database_url=other),
        database_url=sqlite_url,
        task_queue="q",
        client=factory,
    ) as deployment:
        assert (deployment.store.url, deployment.task_queue) == (sqlite_url, "q")
