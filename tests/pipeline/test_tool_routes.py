"""One queue, different tool sets (issue 20 item 5): every call runs where its tool is.

Two real workers with different registries poll one task queue of the shared dev server
(each with its own client, as workers in two processes would). Turns call tools of both
sets; whichever worker an attempt lands on, it runs on a worker that has the tool: a worker
without it refuses it for the peer that has it (``tooltrail.pipeline.directory``) and the turn
sends it to that peer's tools queue (``tooltrail.workflows.routes``). Only a tool that no
worker has is answered "Tool not found". A queue whose workers are alike never routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tooltrail import Host, RunConfig, ToolCall, TurnCancelled, tool
from tooltrail.client import Tooltrail
from tooltrail.core.wire import TOOL_EXECUTE
from tooltrail.db.registry import queue_registries
from tooltrail.db.store import AuditStore
from tooltrail.pipeline.directory import RegistryDirectory, registry_fingerprint
from tooltrail.runtime.worker import build_worker
from tooltrail.tools.scratch import ScratchDirs

TURNS = 30
LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)


@tool
def calculate(expression: str) -> str:
    """Pretend to calculate."""
    return f"calc:{expression}"


@tool(local=True)
def lookup(key: str) -> str:
    """Pretend to look up (a local tool: where the turn's worker lacks it, routed)."""
    return f"look:{key}"


LINGER: dict[str, str] = {}
"""What each ``linger`` call saw: the task queue it ran from, then how it ended."""


@tool
async def linger(ms: int) -> str:
    """Sleep (on the peer), noting the task queue the attempt came from and its end."""
    from temporalio import activity

    call = f"{activity.info().workflow_id}/{activity.info().activity_id}"
    LINGER[call] = activity.info().task_queue
    try:
        await asyncio.sleep(ms / 1000)
    except asyncio.CancelledError:
        LINGER[call] += " cancelled"
        raise
    return "slept"


CALC, LOOK = Host([calculate]), Host([lookup])
CALC_FP = registry_fingerprint(["calculate"])
LOOK_FP = registry_fingerprint(["lookup"])


async def _attempt_queues(client: Client, turn_id: str) -> list[str]:
    """The task queues the turn scheduled its tool attempts on, in order."""
    history = await client.get_workflow_handle(turn_id).fetch_history()
    return [
        event.activity_task_scheduled_event_attributes.task_queue.name
        for event in history.events
        if event.HasField("activity_task_scheduled_event_attributes")
        and event.activity_task_scheduled_event_attributes.activity_type.name == TOOL_EXECUTE
    ]


async def _ready(store: AuditStore, client: Client, task_queue: str, tools: list[str]) -> None:
    """Wait until each tool is served by a live registry of the queue (as a peer sees it)."""
    probe = RegistryDirectory(client, store, task_queue, {}, ttl_s=0.0)
    for _ in range(200):
        if all([await probe.peer_queue_for(name) for name in tools]):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the registries of {task_queue!r} never became live")


@contextlib.asynccontextmanager
async def _two_workers(
    env: WorkflowEnvironment, url: str, tmp_path: Path, peer: Host = LOOK, first: Host = CALC
) -> AsyncIterator[tuple[Tooltrail, str]]:
    client = env.client
    # One Temporal client carries one worker per queue: the peer gets its own.
    other = await Client.connect(
        client.service_client.config.target_host, data_converter=client.data_converter
    )
    task_queue = f"tq-{uuid.uuid4()}"
    store = AuditStore(url)
    try:
        async with (
            build_worker(
                client,
                first,
                task_queue=task_queue,
                store=store,
                scratch=ScratchDirs(tmp_path / "a"),
            ),
            build_worker(
                other, peer, task_queue=task_queue, store=store, scratch=ScratchDirs(tmp_path / "b")
            ),
        ):
            await _ready(
                store, client, task_queue, [*first.registry.names(), *peer.registry.names()]
            )
            yield Tooltrail(client, task_queue=task_queue, store=store), task_queue
    finally:
        await store.close()


async def test_every_call_runs_on_a_worker_that_has_its_tool(
    temporal_env: WorkflowEnvironment, db_url: str, tmp_path: Path
) -> None:
    async with _two_workers(temporal_env, db_url, tmp_path) as (tt, task_queue):
        registries = await queue_registries(tt.store, task_queue=task_queue, seen_since=LONG_AGO)

        async def turn(i: int) -> tuple[list[tuple[str, bool]], list[str], list[str], str]:
            calls = [
                ToolCall(f"c{i}a", "calculate", {"expression": f"{i}+1"}),
                ToolCall(f"c{i}b", "lookup", {"key": f"k{i}"}),
                ToolCall(f"c{i}c", "lookup", {"key": f"m{i}"}),
                ToolCall(f"c{i}d", "calculate", {"expression": f"{i}*2"}),
            ]
            # No names given: the turn advertises every live registry's tools.
            config = RunConfig(dispatch="parallel") if i % 2 else None
            result = await tt.run_turn(calls, session_id=f"s{i}", config=config)
            events = await tt.audit(result.turn_id)
            workers = [
                f"{event.tool_name}@{event.worker}" for event in events if event.kind == "tool_post"
            ]
            routed = [str(event.tool_name) for event in events if event.kind == "tool_routed"]
            queues = await _attempt_queues(tt.client, result.turn_id)
            outputs = [(str(r.output), r.is_error) for r in result.results]
            # The trail still matches Temporal's history (a refused attempt ran nothing).
            verified = await tt.verify(result.turn_id)
            assert verified.ok, verified.problems
            return outputs, workers, routed, ",".join(queues)

        done = await asyncio.gather(*(turn(i) for i in range(TURNS)))
    assert set(registries) == {CALC_FP, LOOK_FP}
    assert set(registries[CALC_FP]) == {"calculate"}
    routed_total: Counter[str] = Counter()
    for i, (outputs, workers, routed, queues) in enumerate(done):
        assert outputs == [
            (f"calc:{i}+1", False),
            (f"look:k{i}", False),
            (f"look:m{i}", False),
            (f"calc:{i}*2", False),
        ], outputs
        # Each body ran on a worker whose registry has the tool.
        assert len(workers) == 4
        for entry in workers:
            name, worker = entry.split("@", 1)
            assert worker.endswith(f"tooltrail:{CALC_FP if name == 'calculate' else LOOK_FP}")
        # A tool is routed at most once per turn (later calls go to the peer directly).
        assert all(count == 1 for count in Counter(routed).values()), routed
        routed_total.update(routed)
        assert queues.count("/tools-") >= len(routed)
    # With two workers on the queue, attempts landed on the wrong one and were sent on.
    assert sum(routed_total.values()) > 0
    assert all("Tool not found" not in text for outputs, *_ in done for text, _ in outputs)


async def test_a_tool_no_worker_has_is_not_found_as_before(
    temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    async with _two_workers(temporal_env, sqlite_url, tmp_path) as (tt, _):
        results = [
            await tt.run_turn(
                [ToolCall(f"n{i}", "nosuch", {}), ToolCall(f"l{i}", "lookup", {"key": "x"})],
                session_id=f"n{i}",
                advertised=["nosuch", "lookup", "calculate"],
            )
            for i in range(4)
        ]
        routes = [
            event
            for r in results
            for event in await tt.audit(r.turn_id)
            if event.kind == "tool_routed"
        ]
    for result in results:
        missing, found = result.results
        assert missing.is_error and str(missing.output).startswith("Tool not found: nosuch.")
        assert (str(found.output), found.is_error) == ("look:x", False)
    # The unknown tool is never sent anywhere: only lookup's calls may be.
    assert {event.tool_name for event in routes} <= {"lookup"}


async def test_a_uniform_queue_keeps_its_attempts_on_the_main_queue(
    stack: StackFactory,
) -> None:
    host = Host([calculate, lookup])
    async with stack(host) as tt:
        results = [
            await tt.run_turn(
                [
                    ToolCall(f"a{i}", "calculate", {"expression": "1"}),
                    ToolCall(f"b{i}", "lookup", {"key": "k"}),
                ],
                session_id=f"u{i}",
            )
            for i in range(5)
        ]
        queues = {q for r in results for q in await _attempt_queues(tt.client, r.turn_id)}
        kinds = {event.kind for r in results for event in await tt.audit(r.turn_id)}
        registries = await queue_registries(tt.store, task_queue=tt.task_queue, seen_since=LONG_AGO)
    assert [str(r.results[1].output) for r in results] == ["look:k"] * 5
    assert queues == {tt.task_queue}
    assert "tool_routed" not in kinds
    # The worker published its registry (and its tools queue exists for peers that lack one).
    assert list(registries) == [registry_fingerprint(["calculate", "lookup"])]


async def test_a_routed_attempt_is_cancelled_with_its_turn(
    temporal_env: WorkflowEnvironment, sqlite_url: str, tmp_path: Path
) -> None:
    # The first call of `linger` lands on either worker; once it was routed, the second goes
    # to the peer's tools queue directly. Cancelling the turn then must reach that attempt.
    config = RunConfig(heartbeat_timeout_s=1, audit_interval_s=0)
    async with _two_workers(temporal_env, sqlite_url, tmp_path, Host([linger])) as (tt, _):
        for n in range(20):
            handle = await tt.start_turn(
                [
                    ToolCall("short", "linger", {"ms": 1}),
                    ToolCall("long", "linger", {"ms": 60_000}),
                ],
                session_id=f"cancel-{n}",
                config=config,
            )
            long_call = f"{handle.turn_id}/"
            for _ in range(400):
                started = [k for k in LINGER if k.startswith(long_call)]
                if len(started) == 2:
                    break
                await asyncio.sleep(0.05)
            long_key = max(started, key=lambda key: int(key.rsplit("/", 1)[1]))
            await handle.cancel()
            with pytest.raises(TurnCancelled):
                await handle.result()
            if "/tools-" in LINGER[long_key]:
                break
        else:
            pytest.fail("no turn of 20 routed its calls")
        events = await tt.audit(handle.turn_id)
    for _ in range(100):  # the body hears of it at its worker's next heartbeat
        if LINGER[long_key].endswith(" cancelled"):
            break
        await asyncio.sleep(0.05)
    queue, _, ended = LINGER[long_key].partition(" ")
    assert "/tools-" in queue and ended == "cancelled"
    assert [e.tool_call_id for e in events if e.kind == "tool_routed"] == ["short"]
    assert ("tool_post", "long") not in [(e.kind, e.tool_call_id) for e in events]
