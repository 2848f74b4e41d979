"""Safe deploys (issue 20 item 12): Temporal worker deployment versioning on a real server.

Two workers of one deployment, build ids v1 and v2, on one task queue. Each answers the same
tool with its own build id, so a result says which version's worker ran the attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowQueryFailedError
from temporalio.common import VersioningBehavior
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.cli.test_cli_contracts import one_error
from tests.support.cli_runner import run_cli
from tooltrail import ConfigurationError, Host, RunConfig, ToolCall, tool
from tooltrail.client import Tooltrail
from tooltrail.core.hooks import Ask, PreToolUseContext
from tooltrail.db.store import AuditStore
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response
from tooltrail.runtime.versioning import (
    current_build_id,
    deployment_config,
    set_current_version,
    workflow_build_id,
)
from tooltrail.runtime.worker import build_worker
from tooltrail.tools.scratch import ScratchDirs
from tooltrail.workflows.agent import AgentRunWorkflow
from tooltrail.workflows.versioned import VersionedAgentRunWorkflow


@tool(name="whoami")
def whoami_v1() -> str:
    """Say which build answered."""
    return "v1"


@tool(name="whoami")
def whoami_v2() -> str:
    """Say which build answered."""
    return "v2"


class AskFirst:
    """Parks every call for an approval, so a turn can wait across a deploy."""

    async def pre_tool(self, ctx: PreToolUseContext) -> Any:
        return Ask("run it?")


INTERACTIVE = RunConfig(interactive=True, approval_timeout_s=120)


@contextlib.asynccontextmanager
async def versioned_worker(
    env: WorkflowEnvironment,
    url: str,
    tmp_path: Path,
    *,
    task_queue: str,
    deployment: str,
    build_id: str,
    model: ScriptedModel | None = None,
) -> AsyncIterator[Worker]:
    store = AuditStore(url)
    host = Host([whoami_v1 if build_id == "v1" else whoami_v2], hooks=[AskFirst()], model=model)
    try:
        async with build_worker(
            env.client,
            host,
            task_queue=task_queue,
            store=store,
            scratch=ScratchDirs(tmp_path / build_id),
            strict_sandbox=True,
            deployment_config=deployment_config(deployment, build_id),
        ) as running:
            yield running
    finally:
        await store.close()


async def wait_parked(handle: Any) -> None:
    for _ in range(600):
        with contextlib.suppress(RPCError, WorkflowQueryFailedError, WorkflowFailureError):
            if await handle.pending_approvals():
                return
        await asyncio.sleep(0.05)
    pytest.fail("the call never parked")


async def separate_client(env: WorkflowEnvironment) -> Client:
    """A client with no worker on it: a start on the workers' own client is eager (the
    server hands the first task to a worker of that client, which pins the turn to that
    worker's version whatever is current)."""
    client = env.client
    return await Client.connect(
        client.service_client.config.target_host, data_converter=client.data_converter
    )


async def test_a_turn_started_on_v1_stays_on_v1_after_v2_becomes_current(
    temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    client = temporal_env.client
    task_queue, deployment = f"tq-{uuid.uuid4()}", f"dep-{uuid.uuid4().hex[:12]}"
    store = AuditStore(sqlite_url)
    # The client lives apart from the workers, as in production (see separate_client).
    starter = await separate_client(temporal_env)
    tt = Tooltrail(starter, Host([whoami_v1]), task_queue=task_queue, store=store)
    call = [ToolCall("c", "whoami", {})]
    options = {"task_queue": task_queue, "deployment": deployment}
    try:
        async with versioned_worker(temporal_env, sqlite_url, tmp_path, build_id="v1", **options):
            await set_current_version(client, deployment, "v1")
            old = await tt.start_turn(
                call, session_id="s-old", config=INTERACTIVE, advertised=["whoami"]
            )
            await wait_parked(old)
            async with versioned_worker(
                temporal_env, sqlite_url, tmp_path, build_id="v2", **options
            ):
                await set_current_version(client, deployment, "v2")
                assert await current_build_id(client, deployment) == "v2"
                # The deploy happened while the old turn waited: its attempt still runs on v1.
                await old.approve("c", by="ops")
                old_result = await old.result()
                new = await tt.start_turn(
                    call, session_id="s-new", config=INTERACTIVE, advertised=["whoami"]
                )
                await wait_parked(new)
                await new.approve("c", by="ops")
                new_result = await new.result()
                assert await workflow_build_id(old.workflow_handle) == "v1"
                assert await workflow_build_id(new.workflow_handle) == "v2"
    finally:
        await store.close()
    assert old_result.results[0].output == "v1"
    assert new_result.results[0].output == "v2"


async def test_an_agent_run_moves_to_the_current_version_turn_by_turn(
    temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    client = temporal_env.client
    task_queue, deployment = f"tq-{uuid.uuid4()}", f"dep-{uuid.uuid4().hex[:12]}"
    # One script for both workers: whichever version runs a model turn takes the next step.
    model = ScriptedModel(
        [
            tool_call_response(("c0", "whoami", {})),
            tool_call_response(("c1", "whoami", {})),
            text_response("done"),
        ]
    )
    store = AuditStore(sqlite_url)
    tt = Tooltrail(
        await separate_client(temporal_env), Host([]), task_queue=task_queue, store=store
    )
    options: dict[str, Any] = {"task_queue": task_queue, "deployment": deployment, "model": model}
    try:
        async with versioned_worker(temporal_env, sqlite_url, tmp_path, build_id="v1", **options):
            await set_current_version(client, deployment, "v1")
            run = await tt.start_agent("who?", session_id="s-agent", config=INTERACTIVE)
            first = tt.get_turn(f"{run.run_id}-turn-0")
            await wait_parked(first)
            async with versioned_worker(
                temporal_env, sqlite_url, tmp_path, build_id="v2", **options
            ):
                await set_current_version(client, deployment, "v2")
                await first.approve("c0", by="ops")
                second = tt.get_turn(f"{run.run_id}-turn-1")
                await wait_parked(second)
                await second.approve("c1", by="ops")
                result = await run.result()
                first_build = await workflow_build_id(first.workflow_handle)
                second_build = await workflow_build_id(second.workflow_handle)
                run_build = await workflow_build_id(client.get_workflow_handle(run.run_id))
            conversation = await tt.conversation(run.run_id)
    finally:
        await store.close()
    assert result.text == "done" and len(result.turns) == 3
    # The turn in flight during the deploy finished on v1; the run's next turn started on v2.
    assert (first_build, second_build, run_build) == ("v1", "v2", "v2")
    assert [m.content for m in conversation if m.role == "tool"] == ["v1", "v2"]


async def test_a_client_shared_with_a_v1_worker_starts_new_turns_on_the_current_version(
    temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    client = temporal_env.client
    task_queue, deployment = f"tq-{uuid.uuid4()}", f"dep-{uuid.uuid4().hex[:12]}"
    options = {"task_queue": task_queue, "deployment": deployment}
    store = AuditStore(sqlite_url)
    # The workers' own client: an eager start would hand the turn to the v1 worker here.
    tt = Tooltrail(client, Host([whoami_v1]), task_queue=task_queue, store=store)
    call = [ToolCall("c", "whoami", {})]
    try:
        async with (
            versioned_worker(temporal_env, sqlite_url, tmp_path, build_id="v2", **options),
            versioned_worker(temporal_env, sqlite_url, tmp_path, build_id="v1", **options),
        ):
            await set_current_version(client, deployment, "v2")
            turns = [
                await tt.start_turn(
                    call, session_id=f"s-{i}", config=INTERACTIVE, advertised=["whoami"]
                )
                for i in range(3)
            ]
            for turn in turns:
                await wait_parked(turn)
                await turn.approve("c", by="ops")
            outputs = [(await turn.result()).results[0].output for turn in turns]
            builds = [await workflow_build_id(turn.workflow_handle) for turn in turns]
    finally:
        await store.close()
    assert outputs == ["v2"] * 3 and builds == ["v2"] * 3


def test_agent_runs_auto_upgrade_and_turns_are_pinned_by_default() -> None:
    versioned = getattr(VersionedAgentRunWorkflow, "__temporal_workflow_definition")
    assert versioned.versioning_behavior == VersioningBehavior.AUTO_UPGRADE
    assert versioned.name == "AgentRunWorkflow"
    # Unversioned workers may not declare a behaviour (the server refuses their tasks).
    plain = getattr(AgentRunWorkflow, "__temporal_workflow_definition")
    assert plain.versioning_behavior == VersioningBehavior.UNSPECIFIED
    config = deployment_config("dep", "b1")
    assert config is not None and config.use_worker_versioning
    assert config.default_versioning_behavior == VersioningBehavior.PINNED
    assert deployment_config(None, None) is None


@pytest.mark.parametrize(("name", "build"), [("dep", None), (None, "b1"), ("", "b1")])
def test_versioning_needs_both_a_deployment_and_a_build_id(
    name: str | None, build: str | None
) -> None:
    with pytest.raises(ConfigurationError, match="both a deployment name and a build id"):
        deployment_config(name, build)


async def test_making_a_version_current_that_never_polled_fails_in_one_line(
    temporal_env: WorkflowEnvironment,
) -> None:
    with pytest.raises(ConfigurationError, match="are its workers running"):
        await set_current_version(
            temporal_env.client, f"dep-{uuid.uuid4().hex[:12]}", "nosuch", timeout_s=0.5
        )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--deployment", "dep"], "both a deployment name and a build id"),
        (["--build-id", "b1"], "both a deployment name and a build id"),
        (["--set-current"], "--set-current needs --deployment and --build-id"),
    ],
)
def test_the_worker_flags_refuse_half_a_version_in_one_line(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    done = run_cli(["worker", "--tools", "tests.support.cli_tools:host", *args], tmp_path)
    one_error(done, expected)
