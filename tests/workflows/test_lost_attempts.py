"""Every attempt accounted for: a tool attempt lost with its worker (SIGKILL, a real
subprocess) is visible in the trail once another worker completes the call.

Real Temporal server, SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.runtime import test_crash
from tests.support import crash_tools
from tests.support.cli_runner import run_cli
from tooltrail import Host, RunConfig, ToolCall, Tooltrail
from tooltrail.db.store import AuditStore
from tooltrail.pipeline.directory import IDENTITY_MARK, registry_fingerprint, worker_identity
from tooltrail.runtime.worker import build_worker

pytestmark = pytest.mark.crash


@pytest.mark.parametrize(
    ("tool_name", "heartbeat_before_death"),
    # fragile_once heartbeats as its body starts (it must not run twice), so its lost
    # attempt names its worker; fragile dies before its first heartbeat: worker unknown.
    [("fragile_once", True), ("fragile", False)],
)
async def test_an_attempt_lost_with_its_worker_is_visible(
    temporal_env: WorkflowEnvironment,
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tool_name: str,
    heartbeat_before_death: bool,
) -> None:
    monkeypatch.setenv("TOOLTRAIL_CRASH_DIR", str(tmp_path))
    client = temporal_env.client
    address = client.service_client.config.target_host
    task_queue = f"lost-{uuid.uuid4()}"
    store = AuditStore(db_url)
    tt = Tooltrail(client, crash_tools.host, task_queue=task_queue, store=store)
    try:
        doomed = await test_crash.start_worker_process(address, task_queue, db_url)
        handle = await tt.start_turn(
            [ToolCall("c1", "echo", {"text": "before"}), ToolCall("c2", tool_name, {})],
            session_id=f"lost-{tool_name}",
            config=RunConfig(heartbeat_timeout_s=2),
        )
        assert await asyncio.wait_for(doomed.wait(), timeout=60) == -9
        async with build_worker(client, crash_tools.host, task_queue=task_queue, store=store):
            turn = await asyncio.wait_for(handle.result(), timeout=60)
        events = await tt.audit(turn.turn_id)
    finally:
        await store.close()
    posts = {e.tool_call_id: e for e in events if e.kind == "tool_post"}
    # Workers are named as Temporal knows them: ``pid@host`` and their registry's fingerprint.
    fingerprint = registry_fingerprint(crash_tools.host.registry.names())
    lost_worker = f"{doomed.pid}@{socket.gethostname()}{IDENTITY_MARK}{fingerprint}"
    survivor = posts["c2"]
    assert survivor.temporal_attempt == 2
    assert survivor.worker == worker_identity(fingerprint) != lost_worker
    assert survivor.payload["lost_attempts"] == [
        {"temporal_attempt": 1, "worker": lost_worker if heartbeat_before_death else None}
    ]
    # The call that ran once, on its first Temporal attempt, lost nothing.
    assert posts["c1"].temporal_attempt == 1 and "lost_attempts" not in posts["c1"].payload
    if db_url.startswith("sqlite") and heartbeat_before_death:
        shown = run_cli(["audit", "show", turn.turn_id, "--database-url", db_url], tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert (
            f"lost call c2 attempt 0: Temporal attempt 1 on worker {lost_worker} was lost; "
            f"attempt 2 on {worker_identity(fingerprint)} completed it"
        ) in " ".join(shown.stdout.split())


async def test_a_kill_between_completion_and_audit_row_loses_nothing(
    temporal_env: WorkflowEnvironment,
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Spec §5.5: the idempotency completion and the attempt's audit row commit together.
    # The doomed worker dies right after `charge` completed its key (a post hook kills it);
    # the survivor's retry must report the `ok` row of the attempt that charged.
    monkeypatch.setenv("TOOLTRAIL_CRASH_DIR", str(tmp_path))
    client = temporal_env.client
    address = client.service_client.config.target_host
    task_queue = f"complete-{uuid.uuid4()}"
    store = AuditStore(db_url)
    survivor = Host(crash_tools.idempotent_host.registry)
    tt = Tooltrail(client, survivor, task_queue=task_queue, store=store)
    try:
        doomed = await test_crash.start_worker_process(address, task_queue, db_url, "idempotent")
        handle = await tt.start_turn(
            [ToolCall("c1", "charge", {"amount": 7})],
            session_id="complete",
            config=RunConfig(heartbeat_timeout_s=2),
        )
        assert await asyncio.wait_for(doomed.wait(), timeout=60) == -9
        async with build_worker(client, survivor, task_queue=task_queue, store=store):
            turn = await asyncio.wait_for(handle.result(), timeout=60)
        events = await tt.audit(turn.turn_id)
    finally:
        await store.close()
    assert turn.results[0].output == "charged 7"
    assert crash_tools.runs("charge") == 1
    posts = [e for e in events if e.kind == "tool_post"]
    assert len(posts) == 1  # one dispatch, one row
    row = posts[0].payload["dispatch"]
    assert (row["status"], row["attempt"], row["value"], row["source_call_id"]) == (
        "ok",
        1,
        "charged 7",
        None,
    )
    assert row["idempotency_key"] and not row["lease_lost"]
    assert posts[0].temporal_attempt == 2
