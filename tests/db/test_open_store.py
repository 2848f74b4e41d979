"""``open_store``: the schema checked (or upgraded) on the store's own engine, once.

The command line's reading commands and every deployment open the audit store through it;
before, each checked the schema on an engine of its own and then opened a second.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import tooltrail.db.store as store_module
from tests.conftest import scratch_postgres_database
from tooltrail import DatabaseSchemaError
from tooltrail.db.migrate import current_revision, head_revision, open_store


@pytest.fixture
async def empty_postgres_url(postgres_server_url: str) -> AsyncIterator[str]:
    """An empty PostgreSQL database of its own (the session's is migrated by other tests)."""
    async with scratch_postgres_database("tooltrail_open") as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database: no tooltrail schema yet."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'empty.db'}"
    return str(request.getfixturevalue("empty_postgres_url"))


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URLs of the engines the audit store creates (a spy on the real function)."""
    made: list[str] = []
    real = store_module.create_engine

    def spy(url: str, **kwargs: Any) -> Any:
        made.append(url)
        return real(url, **kwargs)

    monkeypatch.setattr(store_module, "create_engine", spy)
    return made


async def test_an_empty_database_is_refused_with_the_command_that_fixes_it(
    empty_url: str, engines: list[str]
) -> None:
    with pytest.raises(DatabaseSchemaError, match="tooltrail db upgrade"):
        await open_store(empty_url)
    assert engines == [empty_url]
    assert await current_revision(empty_url) is None  # the check wrote nothing


async def test_migrate_upgrades_and_the_same_engine_serves_the_store(
    empty_url: str, engines: list[str]
) -> None:
    store = await open_store(empty_url, migrate=True)
    try:
        assert engines == [empty_url]
        assert await store.turns(limit=5) == []
    finally:
        await store.close()
    assert await current_revision(empty_url) == head_revision()
    again = await open_store(empty_url)  # at head: the check passes
    await again.close()
    assert engines == [empty_url, empty_url]
