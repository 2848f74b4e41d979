"""With codec keys set: failures are encrypted too, and export, replay, rerun and shadow work.

The in-process worker and the ``tooltrail`` subprocesses share the keys the way a deployment
does: through ``TOOLTRAIL_CODEC_KEYS`` (the settings' one data converter).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.testing import WorkflowEnvironment

from tests.runtime.test_codec import base64_forms, leaks
from tests.support import crash_tools
from tests.support.cli_runner import run_cli
from tooltrail import Host, LoopDetected, LoopDetection, RunConfig, ToolCall, Tooltrail
from tooltrail.db.store import AuditStore
from tooltrail.runtime.codec import ENCODING, codec_from_settings, data_converter, generate_key
from tooltrail.runtime.worker import build_worker, settings_data_converter
from tooltrail.settings import Settings
from tooltrail.tools.scratch import ScratchDirs

KEYS = f"ops:{generate_key()}"
SECRET = f"token-{uuid.uuid4().hex}"


@contextlib.asynccontextmanager
async def running(
    env: WorkflowEnvironment,
    converter: DataConverter,
    url: str,
    tmp_path: Path,
    host: Host = crash_tools.host,
) -> AsyncIterator[Tooltrail]:
    """A worker of ``host`` (the crash tools') on a fresh queue, and a client, both on
    ``converter``."""
    client = await Client.connect(
        env.client.service_client.config.target_host,
        namespace=env.client.namespace,
        data_converter=converter,
    )
    store = AuditStore(url)
    task_queue = f"tq-encrypted-{uuid.uuid4()}"
    try:
        async with build_worker(
            client, host, task_queue=task_queue, store=store, scratch=ScratchDirs(tmp_path)
        ):
            yield Tooltrail(client, host, task_queue=task_queue, store=store)
    finally:
        await store.close()


async def loop_stop(tt: Tooltrail) -> tuple[LoopDetected, WorkflowHistory]:
    """A turn stopped by the loop detector, whose message names a call with a secret."""
    call = ToolCall("c", "echo", {"text": SECRET})
    turn_id = f"turn-{uuid.uuid4()}"
    with pytest.raises(LoopDetected) as caught:
        await tt.run_turn(
            [call.model_copy(update={"id": f"c{i}"}) for i in range(3)],
            session_id=f"loop-{uuid.uuid4()}",
            config=RunConfig(detection=LoopDetection(loop_threshold=1, stop_threshold=2)),
            turn_id=turn_id,
        )
    history = await tt.client.get_workflow_handle(turn_id).fetch_history()
    return caught.value, history


def failed_event_failure(history: WorkflowHistory) -> Any:
    [event] = [
        e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED
    ]
    return event.workflow_execution_failed_event_attributes.failure


async def test_a_secret_in_a_loop_stop_is_not_readable_in_the_history(
    temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    converter = settings_data_converter(Settings(codec_keys=KEYS))
    async with running(temporal_env, converter, sqlite_url, tmp_path) as tt:
        error, history = await loop_stop(tt)
    # The client holds the keys: the failure decodes to the loop detector's own words.
    assert SECRET in str(error) and "repeated 2 times" in str(error)
    # The history holds neither the message nor the stack trace in the clear.
    assert leaks(history, SECRET) == []
    failure = failed_event_failure(history)
    assert failure.message == "Encoded failure"
    assert failure.stack_trace == ""
    assert failure.encoded_attributes.metadata["encoding"] == ENCODING


async def test_without_encoded_failures_the_same_secret_is_readable(
    temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    # The control: payloads encrypted but failure messages not (the converter before this
    # change): the loop stop's message is plaintext in the history.
    codec = codec_from_settings(Settings(codec_keys=KEYS))
    async with running(temporal_env, data_converter(codec), sqlite_url, tmp_path) as tt:
        error, history = await loop_stop(tt)
    assert SECRET in str(error)
    assert "raw event bytes" in leaks(history, SECRET)
    assert SECRET in failed_event_failure(history).message


async def cli(args: list[str], tmp_path: Path, keys: str = KEYS) -> CompletedProcess[str]:
    # In a thread: the worker serving the CLI's turns runs on this event loop.
    return await asyncio.to_thread(run_cli, args, tmp_path, timeout=180, TOOLTRAIL_CODEC_KEYS=keys)


async def test_export_replay_rerun_and_shadow_with_codec_keys(
    temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    address = temporal_env.client.service_client.config.target_host
    converter = settings_data_converter(Settings(codec_keys=KEYS))
    async with running(temporal_env, converter, sqlite_url, tmp_path) as tt:
        turn = await tt.run_turn(
            [ToolCall("c1", "echo", {"text": SECRET})], session_id=f"ops-{uuid.uuid4()}"
        )
        exported = tmp_path / "turn.json"
        done = await cli(
            ["history", "export", turn.turn_id, "-o", str(exported), "--temporal-address", address],
            tmp_path,
        )
        assert done.returncode == 0, done.stderr
        # The export is the history as stored: ciphertext only.
        text = await asyncio.to_thread(exported.read_text)
        assert SECRET not in text
        assert not any(form in text for form in base64_forms(SECRET))

        replayed = await cli(["replay", str(exported), "--json"], tmp_path)
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        assert [o["ok"] for o in json.loads(replayed.stdout)] == [True]

        queried = await cli(
            [
                "replay",
                "--query",
                f'WorkflowId="{turn.turn_id}"',
                "--temporal-address",
                address,
                "--json",
            ],
            tmp_path,
        )
        assert queried.returncode == 0, queried.stdout + queried.stderr
        assert [o["source"] for o in json.loads(queried.stdout)] == [f"server:{turn.turn_id}"]

        common = [
            "--tools",
            "tests.support.crash_tools:host",
            "--temporal-address",
            address,
            "--task-queue",
            tt.task_queue,
            "--database-url",
            sqlite_url,
            "--json",
        ]
        for mode in (["--yes"], ["--shadow"]):
            rerun = await cli(["rerun", turn.turn_id, *mode, *common], tmp_path)
            assert rerun.returncode == 0, rerun.stdout + rerun.stderr
            report = json.loads(rerun.stdout)
            assert report["mode"] == ("shadow" if mode == ["--shadow"] else "rerun")
            assert report["divergences"] == []
            new = await tt.get_turn(report["new_turn_id"]).result()
            assert [r.output for r in new.results] == [SECRET]

    # The control: without the keys the same replay cannot read the history (the bug).
    blind = await cli(["replay", str(exported), "--json"], tmp_path, keys="")
    assert blind.returncode == 1
    assert "binary/encrypted" in blind.stdout
