"""Poisoned turns: a workflow task that keeps failing is reported, not retried silently."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tests.support.cli_runner import run_cli
from tooltrail import Host, tool


@tool
def noop() -> str:
    """Nothing."""
    return ""


async def test_a_poisoned_turn_is_listed_as_stuck(
    stack: StackFactory, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with stack(Host([noop])) as tt:
        # An input the workflow cannot decode: every workflow task fails, forever.
        turn_id = f"poisoned-{uuid.uuid4()}"
        await tt.client.start_workflow(
            "TurnWorkflow",
            {"session_id": "s", "calls": "not a list"},
            id=turn_id,
            task_queue=tt.task_queue,
        )
        stuck = []
        for _ in range(150):
            stuck = [s for s in await tt.stuck_turns() if s.turn_id == turn_id]
            if stuck:
                break
            await asyncio.sleep(0.2)
        assert stuck and stuck[0].attempts >= 2
        address = temporal_env.client.service_client.config.target_host
        args = ["audit", "list", "--stuck", "--temporal-address", address]
        done = await asyncio.to_thread(run_cli, args, tmp_path)
        as_json = await asyncio.to_thread(run_cli, [*args, "--json"], tmp_path)
        await tt.client.get_workflow_handle(turn_id).terminate("test over")
    assert done.returncode == 3, "a gate fails on stuck turns: " + done.stderr
    assert f"stuck {turn_id}" in done.stdout
    assert as_json.returncode == 3, as_json.stderr
    listed = json.loads(as_json.stdout)  # stdout is the JSON document, nothing else
    assert turn_id in {item["turn_id"] for item in listed}
