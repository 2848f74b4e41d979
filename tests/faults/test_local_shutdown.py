"""``tooltrail.local`` shuts down promptly while a turn's final audit write keeps retrying.

The final write is a local activity that retries until the database answers; a worker's
shutdown waits for the workflow task that holds it. ``local()`` bounds that wait, then
cancels the worker (with the in-memory embedded server, that turn's unwritten records end
with the process; against a persistent server the next worker writes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import tooltrail
from tests.faults.pg import ThrowawayPostgres
from tooltrail import Host, ToolCall, tool
from tooltrail.db.migrate import upgrade

pytestmark = [pytest.mark.crash, pytest.mark.timeout(150)]

SHUTDOWN_S = 3.0


@tool
async def pause() -> str:
    """Take a moment, so the database can go away before the turn ends."""
    await asyncio.sleep(0.5)
    return "done"


@contextlib.asynccontextmanager
async def sqlite_locked(tmp_path: Path) -> AsyncIterator[tuple[str, object]]:
    url = f"sqlite:///{tmp_path / 'locked.db'}"
    await upgrade(url)
    # A worker writes at start too (its directory rows): the lock waits for those writes.
    holder = sqlite3.connect(tmp_path / "locked.db", isolation_level=None, timeout=30)

    async def break_it() -> None:
        holder.execute("BEGIN EXCLUSIVE")  # every writer now waits, then fails: "locked"

    try:
        yield url, break_it
    finally:
        holder.close()


@contextlib.asynccontextmanager
async def postgres_stopped(server: ThrowawayPostgres) -> AsyncIterator[tuple[str, object]]:
    await upgrade(server.url)
    yield server.url, server.stop


async def shuts_down_promptly(
    broken: contextlib.AbstractAsyncContextManager[tuple[str, object]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tooltrail.client")
    async with broken as (url, break_it):
        async with tooltrail.local(
            Host([pause]), database_url=url, shutdown_timeout_s=SHUTDOWN_S
        ) as tt:
            handle = await tt.start_turn([ToolCall("c", "pause", {})], session_id="shutdown")
            await break_it()  # type: ignore[operator]
            waiting = asyncio.create_task(handle.result())
            await asyncio.sleep(3)  # the turn's final write is failing and retrying by now
            assert not waiting.done(), "the turn cannot end while its last write fails"
            leaving = time.monotonic()
        took = time.monotonic() - leaving
        waiting.cancel()
    assert took < SHUTDOWN_S + 15, f"local() took {took:.1f}s to shut down"
    assert any("did not stop within" in r.getMessage() for r in caplog.records)
    # The cancelled write's connection is dropped, not closed: let it go here, in this test.
    await asyncio.sleep(0.5)
    gc.collect()


# The write cancelled in the middle of a locked SQLite call leaves its aiosqlite connection
# to the garbage collector, which says so (a ResourceWarning): expected of a forced cancel.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_local_shuts_down_promptly_while_a_locked_sqlite_refuses_the_final_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await shuts_down_promptly(sqlite_locked(tmp_path), caplog)


# The locked-SQLite test above leaves an aiosqlite connection to the garbage collector; it may
# be collected (with its ResourceWarning) while this test runs.
@pytest.mark.postgres
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_local_shuts_down_promptly_while_postgresql_is_down(
    throwaway_pg: ThrowawayPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    await shuts_down_promptly(postgres_stopped(throwaway_pg), caplog)
