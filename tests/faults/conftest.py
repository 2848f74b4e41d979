"""Fixtures of the fault suite: a throwaway PostgreSQL the test may stop and start."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.faults.pg import PostgresUnavailable, ThrowawayPostgres, check_available
from tests.faults.pg import throwaway_postgres as _throwaway_postgres


@pytest.fixture
async def throwaway_pg() -> AsyncIterator[ThrowawayPostgres]:
    """A PostgreSQL server of this test's own (never the shared one on 5432), with a database
    at ``.url``; ``await .stop()`` / ``await .start()`` on demand; removed afterwards."""
    try:
        check_available()
    except PostgresUnavailable as exc:
        pytest.skip(f"THROWAWAY POSTGRESQL TESTS SKIPPED: {exc}")
    async with _throwaway_postgres() as server:
        yield server
