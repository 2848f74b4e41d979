"""Workers with different tool sets on one task queue (issue 20 item 5): detection.

Two real workers on one queue of the shared dev server, one with ``lookup`` and one without:
each sees the other through Temporal's list of the queue's pollers and logs a warning.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tooltrail import Host, tool
from tooltrail.db.store import AuditStore
from tooltrail.pipeline.directory import (
    mismatched_pollers,
    registry_fingerprint,
    watch_registry_peers,
)
from tooltrail.runtime.worker import build_worker
from tooltrail.tools.scratch import ScratchDirs


@tool
def calculate(expression: str) -> str:
    """Pretend to calculate."""
    return expression


@tool
def lookup(key: str) -> str:
    """Pretend to look up."""
    return key


def test_the_fingerprint_is_the_set_of_names() -> None:
    assert registry_fingerprint(["a", "b"]) == registry_fingerprint(["b", "a", "a"])
    assert registry_fingerprint(["a"]) != registry_fingerprint(["a", "b"])


async def test_a_worker_with_other_tools_on_the_queue_is_seen_and_warned_about(
    temporal_env: WorkflowEnvironment,
    db_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = temporal_env.client
    # One Temporal client may carry one worker per queue: the peer gets its own, like a
    # worker in another process.
    other = await Client.connect(
        client.service_client.config.target_host, data_converter=client.data_converter
    )
    task_queue = f"tq-{uuid.uuid4()}"
    demo, mine = Host([calculate]), Host([calculate, lookup])
    demo_fp = registry_fingerprint(demo.registry.names())
    mine_fp = registry_fingerprint(mine.registry.names())
    store = AuditStore(db_url)
    try:
        async with (
            build_worker(
                client,
                demo,
                task_queue=task_queue,
                store=store,
                scratch=ScratchDirs(tmp_path / "a"),
            ),
            build_worker(
                other,
                mine,
                task_queue=task_queue,
                store=store,
                scratch=ScratchDirs(tmp_path / "b"),
            ),
        ):
            # Pollers show up once they have polled.
            for _ in range(100):
                seen_by_demo = await mismatched_pollers(client, task_queue, demo_fp)
                if seen_by_demo:
                    break
                await asyncio.sleep(0.1)
            seen_by_mine = await mismatched_pollers(client, task_queue, mine_fp)
            with caplog.at_level(logging.WARNING, logger="tooltrail.registry_check"):
                async with watch_registry_peers(
                    client, task_queue, demo_fp, demo.registry.names(), interval_s=0.05
                ):
                    for _ in range(100):
                        if caplog.records:
                            break
                        await asyncio.sleep(0.05)
            alone = await mismatched_pollers(client, f"tq-{uuid.uuid4()}", demo_fp)
    finally:
        await store.close()
    assert seen_by_demo and all(peer.endswith(f"tooltrail:{mine_fp}") for peer in seen_by_demo)
    assert seen_by_mine and all(peer.endswith(f"tooltrail:{demo_fp}") for peer in seen_by_mine)
    assert alone == []
    [record] = caplog.records
    message = record.getMessage()
    assert "WORKERS WITH DIFFERENT TOOLS SHARE TASK QUEUE" in message
    assert task_queue in message and mine_fp in message and "calculate" in message


async def test_local_without_a_worker_leaves_the_queue_to_the_workers_started_elsewhere(
    tmp_path: Path,
) -> None:
    # `tooltrail dev --no-worker`: the embedded server and a client, no demo-tools worker that
    # could take the turns of a worker with other tools.
    import tooltrail
    from tooltrail import ToolCall

    url = f"sqlite:///{tmp_path / 'audit.db'}"
    task_queue = f"tq-{uuid.uuid4()}"
    async with tooltrail.local(
        Host([calculate]), database_url=url, task_queue=task_queue, worker=False
    ) as tt:
        client = tt.client
        other = await Client.connect(
            client.service_client.config.target_host,
            namespace=client.namespace,
            data_converter=client.data_converter,
        )
        store = AuditStore(url)
        try:
            pollers_before = await mismatched_pollers(client, task_queue, "nothing-polls")
            async with build_worker(
                other,
                Host([calculate, lookup]),
                task_queue=task_queue,
                store=store,
                scratch=ScratchDirs(tmp_path / "mine"),
            ):
                turns = [
                    await tt.run_turn(
                        [ToolCall(f"c{i}", "lookup", {"key": f"k{i}"})],
                        session_id=f"s{i}",
                        advertised=["calculate", "lookup"],
                    )
                    for i in range(3)
                ]
        finally:
            await store.close()
    assert pollers_before == []
    assert [turn.results[0].output for turn in turns] == ["k0", "k1", "k2"]
    assert not any(turn.results[0].is_error for turn in turns)
