"""Every model call attempt is a ``model_call`` row: failed ones too, with tokens and cost."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import DataError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import tooltrail.activities.conversation as conversation
from tests.conftest import StackFactory
from tests.support.cli_runner import run_cli
from tests.support.stand_ins import SlowModel
from tooltrail import Host, TurnFailed, tool
from tooltrail.activities.conversation import ConversationActivities
from tooltrail.activities.recorder import Recorder
from tooltrail.core.messages import Message, ModelRequest, ModelResponse, Usage
from tooltrail.core.wire import ModelPhase, ModelSettings, ModelTurnRequest
from tooltrail.db.model_calls import list_model_calls, totals
from tooltrail.db.store import AuditStore
from tooltrail.llm.errors import ModelHTTPError
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response

PRICES = json.dumps({"test-model": {"input": 3, "output": 15, "cached_input": 0.3}})
USAGE = Usage(input_tokens=1000, output_tokens=200, cache_read_tokens=400, reasoning_tokens=50)
COST = (600 * 3 + 400 * 0.3 + 200 * 15) / 1_000_000


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class RateLimitedTwice(ScriptedModel):
    """Answers from its script after two 429s."""

    def __init__(self, responses: list[ModelResponse]) -> None:
        super().__init__(responses)
        self.refused = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if self.refused < 2:
            self.refused += 1
            # A short Retry-After: Temporal's next attempt comes at once.
            raise ModelHTTPError(429, "rate limited", 0.01, request_id=f"req-{self.refused}")
        return await super().complete(request)


@pytest.mark.parametrize("local_model", [False, True])
async def test_each_attempt_is_recorded_with_its_error_or_tokens_and_cost(
    stack: StackFactory, db_url: str, local_model: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLTRAIL_MODEL_PRICES", PRICES)
    model = RateLimitedTwice([text_response("done", usage=USAGE)])
    run_id = f"mc-{uuid.uuid4().hex[:8]}"
    async with stack(Host([add], model=model), database_url=db_url) as tt:
        result = await tt.run_agent(
            "hi", session_id=run_id, run_id=run_id, model="test-model", local_model=local_model
        )
        by_run = await tt.model_calls(run_id=run_id)
        by_turn = await tt.model_calls(result.turns[0])
    assert result.text == "done"
    assert by_run == by_turn
    assert [c.attempt for c in by_run] == [1, 2, 3]
    assert {(c.turn_id, c.run_id, c.seq) for c in by_run} == {(result.turns[0], run_id, 1)}
    assert len({c.temporal_run_id for c in by_run}) == 1 and by_run[0].temporal_run_id
    assert {(c.provider, c.model) for c in by_run} == {("RateLimitedTwice", "test-model")}
    # The same request each time: one digest.
    assert len({c.request_sha256 for c in by_run}) == 1 and len(by_run[0].request_sha256) == 64
    assert all(c.latency_ms >= 0 for c in by_run)
    failed, answered = by_run[:2], by_run[2]
    for call in failed:
        assert call.error_type == "ModelUnavailable"
        assert call.error is not None and "429" in call.error
        assert (call.input_tokens, call.output_tokens, call.cost_usd) == (None, None, None)
    assert answered.error is None and answered.stop_reason == "end_turn"
    assert (
        answered.input_tokens,
        answered.output_tokens,
        answered.cached_tokens,
        answered.reasoning_tokens,
    ) == (1000, 200, 400, 50)
    assert answered.cost_usd == pytest.approx(COST)
    sums = totals(by_run)
    assert (sums.calls, sums.failed, sums.input_tokens, sums.output_tokens) == (3, 2, 1000, 200)
    assert sums.cost_usd == pytest.approx(COST)


async def test_a_cut_off_answer_is_recorded_with_its_tokens_and_error(
    stack: StackFactory,
) -> None:
    cut = tool_call_response(("c1", "add", '{"a": 1'), usage=Usage(input_tokens=5, output_tokens=9))
    cut.stop_reason = "max_tokens"
    run_id = f"mc-cut-{uuid.uuid4().hex[:8]}"
    async with stack(Host([add], model=ScriptedModel([cut]))) as tt:
        with pytest.raises(TurnFailed, match="cut off"):
            await tt.run_agent("hi", session_id=run_id, run_id=run_id)
        calls = await tt.model_calls(run_id=run_id)
    assert len(calls) == 1
    (call,) = calls
    assert (call.error_type, call.stop_reason) == ("ModelOutputTruncated", "max_tokens")
    assert (call.input_tokens, call.output_tokens, call.cost_usd) == (5, 9, None)
    assert call.provider == "ScriptedModel" and call.model is None


async def test_audit_show_prints_the_model_calls_tokens_and_cost(
    stack: StackFactory,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLTRAIL_MODEL_PRICES", PRICES)
    model = RateLimitedTwice(
        [
            tool_call_response(("c1", "add", {"a": 1, "b": 2}), usage=USAGE),
            text_response("three", usage=USAGE),
        ]
    )
    run_id = f"mc-cli-{uuid.uuid4().hex[:8]}"
    async with stack(Host([add], model=model), database_url=sqlite_url) as tt:
        result = await tt.run_agent("add", session_id=run_id, run_id=run_id, model="test-model")

    def show(*args: str) -> str:
        done = run_cli(["audit", "show", *args], tmp_path, TOOLTRAIL_DATABASE_URL=sqlite_url)
        assert done.returncode == 0, done.stderr
        return done.stdout

    first = result.turns[0]
    turn_text, turn_json, run_text, run_json = await asyncio.gather(
        *(
            asyncio.to_thread(show, *args)
            for args in ([first], [first, "--json"], [run_id], [run_id, "--json"])
        )
    )
    assert "Model calls" in turn_text
    assert turn_text.count("ModelUnavailable") == 2 and "429" in turn_text
    assert f"${COST:.4f}" in turn_text
    assert "3 model calls (2 failed): 1,000 in (400 cached), 200 out" in turn_text
    data = json.loads(turn_json)
    assert [c["attempt"] for c in data["model_calls"]] == [1, 2, 3]
    assert data["model_totals"]["cost_usd"] == pytest.approx(COST)
    # The run: per turn, and in total (the second turn's call answered at once).
    assert "Turns" in run_text
    assert f"${2 * COST:.4f}" in run_text
    assert "4 model calls (2 failed): 2,000 in (800 cached), 400 out" in run_text
    run = json.loads(run_json)
    assert [t["model_calls"] for t in run["turns"]] == [3, 1]
    assert [t["cost_usd"] for t in run["turns"]] == pytest.approx([COST, COST])
    assert run["model_totals"]["cost_usd"] == pytest.approx(2 * COST)
    assert run["model_totals"]["input_tokens"] == 2000


# -- the activity on its own: cancellation, an outage, a refused record ------------------------


def turn_request(run_id: str) -> ModelTurnRequest:
    return ModelTurnRequest(
        phase=ModelPhase(
            run_id=run_id,
            start_seq=0,
            new_messages=[Message.user("hi")],
            settings=ModelSettings(model="test-model"),
        ),
        turn_id=f"{run_id}-turn-0",
    )


async def calls_of(store: AuditStore, run_id: str) -> list[Any]:
    async with store.sessions() as session:
        return await list_model_calls(session, run_id=run_id)


async def test_a_cancelled_model_call_is_recorded(sqlite_url: str) -> None:
    env = ActivityEnvironment()
    store = AuditStore(sqlite_url)
    try:
        activities = ConversationActivities(SlowModel(), Recorder(store))
        task = asyncio.ensure_future(env.run(activities.model_turn, turn_request("run-cancel")))
        await asyncio.sleep(0.5)
        env.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        calls = await calls_of(store, "run-cancel")
    finally:
        await store.close()
    assert [(c.error_type, c.input_tokens) for c in calls] == [("Cancelled", None)]
    assert calls[0].latency_ms >= 400


async def test_a_failed_attempts_record_waits_a_bounded_time_for_the_database(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tries = 0

    async def down(*_: Any, **__: Any) -> None:
        nonlocal tries
        tries += 1
        raise OSError("connection refused")

    monkeypatch.setattr(conversation, "record_model_call", down)
    monkeypatch.setattr(conversation, "MODEL_CALL_WRITE_WAIT_S", 0.5)
    model = RateLimitedTwice([text_response("done")])
    store = AuditStore(sqlite_url)
    try:
        activities = ConversationActivities(model, Recorder(store))
        started = time.monotonic()
        with pytest.raises(ApplicationError) as failed:
            await ActivityEnvironment().run(activities.model_turn, turn_request("run-down"))
        waited = time.monotonic() - started
    finally:
        await store.close()
    # The retryable failure still reaches Temporal, after the bounded wait.
    assert failed.value.type == "ModelUnavailable"
    assert tries > 1 and 0.4 <= waited < 3, (tries, waited)


async def test_a_refused_record_never_costs_the_answer(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refused(*_: Any, **__: Any) -> None:
        raise DataError("INSERT", {}, Exception("value refused"))

    monkeypatch.setattr(conversation, "record_model_call", refused)
    store = AuditStore(sqlite_url)
    try:
        activities = ConversationActivities(ScriptedModel([text_response("kept")]), Recorder(store))
        outcome = await ActivityEnvironment().run(
            activities.model_turn, turn_request("run-refused")
        )
        conversation_ = await store.conversation("run-refused")
    finally:
        await store.close()
    assert outcome.response.message.content == "kept"
    assert [m.content for m in conversation_] == ["hi", "kept"]
