"""An agent's model on a queue of workers with different tools is offered all their tools.

Two real workers with different registries (and each its own model client) poll one task
queue of the shared dev server, as in ``tests/pipeline/test_tool_routes.py``. Whichever worker
runs a
model call, the model is offered both sets (the worker's own catalog entries and the live
peer's, published in the ``tool_registry`` directory), and its call of the peer's tool runs
on the peer and comes back as the tool's result. On a uniform queue the model is offered
exactly its worker's tools, as before.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.testing import WorkflowEnvironment

from tests.conftest import StackFactory
from tests.pipeline.test_tool_routes import CALC_FP, LOOK_FP, _two_workers, calculate, lookup
from tooltrail import Host
from tooltrail.activities.conversation import ConversationActivities
from tooltrail.activities.planning import TurnPlanner
from tooltrail.activities.tool_execution import Recorder
from tooltrail.core.messages import ModelRequest, ModelResponse
from tooltrail.core.wire import ModelPhase, ModelSettings, ModelTurnRequest
from tooltrail.db.registry import publish_registry, read_registries
from tooltrail.db.store import AuditStore
from tooltrail.llm.scripted import text_response, tool_call_response
from tooltrail.pipeline.directory import (
    PEER_OFFER_DEADLINE_S,
    PUBLISH_DEADLINE_S,
    READ_DEADLINE_S,
    PeerOffer,
    RegistryDirectory,
)

RUNS = 12
LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)


class CrossingModel:
    """Notes what it is offered; calls the other worker's tool once, then says its result.

    Args:
        worker: the name of the worker whose host holds this model.
        seen: where every call is noted as (run's prompt, worker, offered tool names).
    """

    def __init__(self, worker: str, seen: list[tuple[str, str, list[str]]]) -> None:
        self.worker = worker
        self.seen = seen

    async def complete(self, request: ModelRequest) -> ModelResponse:
        offered = [spec["function"]["name"] for spec in request.tools]
        self.seen.append((request.messages[0].content, self.worker, offered))
        last = request.messages[-1]
        if last.role == "tool":
            return text_response(f"{'error' if last.is_error else 'got'} {last.content}")
        if self.worker == "calc":
            return tool_call_response(("c1", "lookup", {"key": "k"}))
        return tool_call_response(("c1", "calculate", {"expression": "1+1"}))


async def test_every_model_call_is_offered_both_tool_sets_and_the_peers_tool_runs(
    temporal_env: WorkflowEnvironment, db_url: str, tmp_path: Path
) -> None:
    seen: list[tuple[str, str, list[str]]] = []
    calc = Host([calculate], model=CrossingModel("calc", seen))
    look = Host([lookup], model=CrossingModel("look", seen))
    async with _two_workers(temporal_env, db_url, tmp_path, peer=look, first=calc) as (tt, _):
        prompts = [f"run {i} {uuid.uuid4().hex[:6]}" for i in range(RUNS)]
        results = await asyncio.gather(
            *(tt.run_agent(prompt, session_id=f"s-{prompt}") for prompt in prompts)
        )
        trails = [await tt.audit(turn) for result in results for turn in result.turns]
        conversations = [await tt.conversation(result.run_id) for result in results]
        # The catalog workflow lists the union too, whichever worker answers.
        catalogs = [await tt.worker_tools(refresh=True) for _ in range(4)]
    # Every model call, on either worker, was offered both sets (sorted by name).
    assert len(seen) == 2 * RUNS
    assert all(offered == ["calculate", "lookup"] for _, _, offered in seen), seen
    # Both workers ran model calls (else this test proves nothing about a peer's model).
    assert {worker for _, worker, _ in seen} == {"calc", "look"}
    for prompt, result, conversation in zip(prompts, results, conversations, strict=True):
        first = next(worker for text, worker, _ in seen if text == prompt)
        # The model called the other worker's tool: it ran there and its result came back.
        expected = "got look:k" if first == "calc" else "got calc:1+1"
        assert (result.text, result.stopped_by, len(result.turns)) == (expected, "answer", 2)
        tool_message = next(m for m in conversation if m.role == "tool")
        assert not tool_message.is_error
    for events in trails:
        for event in events:
            if event.kind == "tool_post":
                owner = CALC_FP if event.tool_name == "calculate" else LOOK_FP
                assert str(event.worker).endswith(f"tooltrail:{owner}"), event
    tool_posts = [e for events in trails for e in events if e.kind == "tool_post"]
    assert len(tool_posts) == RUNS
    # Calls that landed on the worker without their tool went on by the existing routes.
    assert any(e.kind == "tool_routed" for events in trails for e in events)
    assert all(c.names == ["calculate", "lookup"] for c in catalogs)
    assert all(set(c.tools) == {"calculate", "lookup"} for c in catalogs)
    assert all(c.tools["lookup"].local for c in catalogs)  # the peer's own declaration


async def test_a_uniform_queue_offers_exactly_its_tools(stack: StackFactory) -> None:
    seen: list[tuple[str, str, list[str]]] = []
    requests: list[ModelRequest] = []

    class Recording(CrossingModel):
        async def complete(self, request: ModelRequest) -> ModelResponse:
            requests.append(request)
            return await super().complete(request)

    host = Host([lookup, calculate], model=Recording("look", seen))
    async with stack(host) as tt:
        result = await tt.run_agent("hi", session_id="uniform")
        catalog = await tt.worker_tools()
    assert result.text == "got calc:1+1"
    # The worker's own catalog, in its registry's order, exactly as before.
    assert [request.tools for request in requests] == [host.registry.openai_tools()] * 2
    assert catalog.names == host.registry.names()


async def test_the_directory_keeps_each_catalog_entry_byte_for_byte(db_url: str) -> None:
    store = AuditStore(db_url)
    queue = f"tq-{uuid.uuid4()}"
    # Keys out of any sorted order (JSONB would reorder them), and text JSON cannot hold raw.
    entry: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": "zeta",
            "description": "Ünïcode and a NUL \x00 inside",
            "parameters": {"type": "object", "properties": {"b": {}, "a": {}, "aa": {}}},
        },
    }
    try:
        await publish_registry(
            store,
            task_queue=queue,
            fingerprint="f1",
            tools={"zeta": {}},
            catalog=[entry],
            now=datetime.now(UTC),
        )
        found = await read_registries(store, task_queue=queue, seen_since=LONG_AGO)
    finally:
        await store.close()
    assert json.dumps(found["f1"].catalog) == json.dumps([entry])
    assert found["f1"].tools == {"zeta": {}}


def _request(advertised: list[str] | None = None) -> ModelTurnRequest:
    phase = ModelPhase(run_id="r", start_seq=0, new_messages=[], settings=ModelSettings())
    return ModelTurnRequest(phase=phase, turn_id="t", advertised=advertised)


async def test_a_model_turn_offers_its_own_tools_when_the_directory_cannot_be_read(
    temporal_env: WorkflowEnvironment, sqlite_url: str
) -> None:
    # The directory's database does not answer (nothing listens there): the model is offered
    # the worker's own tools, and the plan advertises them, without waiting long.
    down = AuditStore("postgresql+asyncpg://tooltrail@127.0.0.1:1/none")
    store = AuditStore(sqlite_url)
    host = Host([calculate])
    directory = RegistryDirectory(temporal_env.client, down, "tq-down", {"calculate": {}})
    planner = TurnPlanner(host, store, directory)
    activities = ConversationActivities(
        CrossingModel("calc", []),
        Recorder(store, [], []),
        planner,
        host.registry.openai_tools,
        directory=directory,
    )
    try:
        started = time.monotonic()
        offer = await activities._peer_offer()
        took = time.monotonic() - started
    finally:
        await down.close()
        await store.close()
    assert offer == PeerOffer({}, [])
    assert activities._catalog(_request(), offer) == host.registry.openai_tools()
    plan = planner.plan([], advertised=None, parallel=False, memo=False, peer_tools=offer.tools)
    assert plan.advertised == ["calculate"]
    assert took < PEER_OFFER_DEADLINE_S + 1


@pytest.mark.postgres
async def test_a_model_turn_does_not_wait_on_a_directory_that_hangs(
    temporal_env: WorkflowEnvironment, postgres_url: str
) -> None:
    # The directory's table is locked (a read of it hangs): after the directory's read
    # deadline the model is offered the worker's own tools.
    store = AuditStore(postgres_url)
    host = Host([calculate])
    directory = RegistryDirectory(temporal_env.client, store, "tq-hang", {"calculate": {}})
    activities = ConversationActivities(
        CrossingModel("calc", []),
        Recorder(store, [], []),
        None,
        host.registry.openai_tools,
        directory=directory,
    )
    locker = await asyncpg.connect(postgres_url.replace("+asyncpg", ""))
    try:
        async with locker.transaction():
            await locker.execute("LOCK TABLE tool_registry IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            offer = await activities._peer_offer()
            took = time.monotonic() - started
    finally:
        await locker.close()
        await store.close()
    assert offer == PeerOffer({}, [])
    assert activities._catalog(_request(), offer) == host.registry.openai_tools()
    assert READ_DEADLINE_S - 0.5 < took < PEER_OFFER_DEADLINE_S + 1


@pytest.mark.postgres
async def test_publishing_the_registry_does_not_wait_on_a_database_that_hangs(
    temporal_env: WorkflowEnvironment, postgres_url: str
) -> None:
    # A worker publishes its registry before it polls: with the directory's table locked (a
    # write hangs), the publication is given up after its deadline, so the worker starts.
    store = AuditStore(postgres_url)
    directory = RegistryDirectory(temporal_env.client, store, "tq-hang-publish", {"lookup": {}})
    locker = await asyncpg.connect(postgres_url.replace("+asyncpg", ""))
    try:
        async with locker.transaction():
            await locker.execute("LOCK TABLE tool_registry IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            # (Bounded here too: unbounded, the publication would wait for this very lock.)
            await asyncio.wait_for(directory.publish(), PUBLISH_DEADLINE_S + 5)
            took = time.monotonic() - started
        # Released: the next publication lands.
        await directory.publish()
        rows = await read_registries(
            store, task_queue="tq-hang-publish", seen_since=datetime(2000, 1, 1, tzinfo=UTC)
        )
    finally:
        await locker.close()
        await store.close()
    assert PUBLISH_DEADLINE_S - 0.5 < took < PUBLISH_DEADLINE_S + 2
    assert list(rows) == [directory.fingerprint]


def test_the_offer_is_the_union_sorted_own_entries_first_filtered_by_advertised() -> None:
    host = Host([lookup, calculate])
    own = host.registry.openai_tools()
    peer_lookup = {"type": "function", "function": {"name": "lookup", "description": "theirs"}}
    alpha = {"type": "function", "function": {"name": "alpha", "description": "a peer's"}}
    offer = PeerOffer({"alpha": {}, "lookup": {}}, [alpha, peer_lookup])
    activities = ConversationActivities(
        CrossingModel("x", []),
        None,  # type: ignore[arg-type]  # the catalog needs no database
        None,
        host.registry.openai_tools,
    )
    by_name = {spec["function"]["name"]: spec for spec in own}
    # Sorted by name; this worker's own entry wins the clash on "lookup".
    assert activities._catalog(_request(), offer) == [
        alpha,
        by_name["calculate"],
        by_name["lookup"],
    ]
    assert activities._catalog(_request(["alpha", "lookup"]), offer) == [alpha, by_name["lookup"]]
    # No peers: the worker's own catalog in its own order, as before.
    assert activities._catalog(_request(), PeerOffer({}, [])) == own
