"""One worker process per SQLite file, unless TOOLTRAIL_SQLITE_SHARED (issue 22, 13)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.faults.fault_tools import FAULT_DIR_ENV
from tests.faults.workers import start_worker
from tooltrail import Host
from tooltrail.db.sqlite_guard import lock_path
from tooltrail.db.store import AuditStore
from tooltrail.errors import ConfigurationError
from tooltrail.runtime.worker import build_worker

pytestmark = pytest.mark.timeout(120)


async def test_second_worker_process_on_one_sqlite_file_is_refused(
    temporal_env: WorkflowEnvironment,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    monkeypatch.delenv("TOOLTRAIL_SQLITE_SHARED", raising=False)
    client = temporal_env.client
    address = client.service_client.config.target_host
    task_queue = f"guard-{uuid.uuid4()}"
    other = await start_worker(address, task_queue, sqlite_url, tmp_path, name="first")
    store = AuditStore(sqlite_url)
    try:
        with pytest.raises(ConfigurationError) as refused:
            build_worker(client, Host(), task_queue=task_queue, store=store)
        message = str(refused.value)
        assert f"(pid {other.pid})" in message
        assert "PostgreSQL" in message and "TOOLTRAIL_SQLITE_SHARED" in message
        # With the deployment's consent the file is shared.
        monkeypatch.setenv("TOOLTRAIL_SQLITE_SHARED", "true")
        build_worker(client, Host(), task_queue=f"{task_queue}-a", store=store)
        monkeypatch.delenv("TOOLTRAIL_SQLITE_SHARED")
        # Once the first worker is gone, the file is free again; workers of one process
        # share it, and closing their store gives it back.
        assert await other.kill() == -9
        build_worker(client, Host(), task_queue=f"{task_queue}-b", store=store)
        build_worker(client, Host(), task_queue=f"{task_queue}-c", store=store)
        assert store.worker_claims == 2
    finally:
        await other.kill()
        await store.close()
    assert store.worker_claims == 0
    path = lock_path(sqlite_url)
    assert path is not None and path.exists()


def test_only_sqlite_files_are_guarded() -> None:
    assert lock_path("postgresql+asyncpg://u@h/db") is None
    assert lock_path("sqlite:///:memory:") is None
    assert lock_path("sqlite+aiosqlite:////tmp/x/audit.db") == Path("/tmp/x/audit.db.worker-lock")
