"""The model-turn activity: the conversation in SQL, one model call per turn.

The activity appends what the model has not seen yet (the prompt, or the last turn's tool
results) at positions the workflow chose, then asks the model and stores the answer after
them. Every write is keyed on (run, position), so a retried activity writes nothing twice;
and when the answer is already stored (the worker died after storing it), the retry returns
it instead of asking the model again.

Two decisions about an answer are made here, so the workflows need not know providers:

- an answer cut off by ``max_tokens`` (or the context window) that asks for tools, or that
  says nothing at all (thinking used the whole budget), is never stored nor run: the
  activity fails for good with ``ModelOutputTruncated``, which the turn reports as
  ``TurnFailed("model call failed: ...")`` naming the budget to raise. A cut-off answer with
  text is an answer: the run returns it, with ``stop_reason="max_tokens"``;
- the thinking blocks of an answer are stored with it in the conversation (the next model
  call sends them back with the tool results), but the answer the workflow receives leaves
  them out: they can be long, and the workflow history need not hold them.

Every attempt at asking the model is a ``model_call`` row (``tooltrail.db.model_calls``):
its provider, model, request digest, latency, tokens, stop reason, error and estimated cost,
written before a failure is raised (so Temporal's retry is a row of its own) and after an
answer. The row is written best-effort, waiting at most ``MODEL_CALL_WRITE_WAIT_S`` for a
database that is down: a paid answer is never lost, nor a retry held up, for its record.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import TypeAdapter
from temporalio import activity
from temporalio.exceptions import ApplicationError

from tooltrail.activities.body_journal import until_written
from tooltrail.activities.planning import TurnPlanner
from tooltrail.activities.recorder import Recorder
from tooltrail.activities.tool_execution import heartbeating
from tooltrail.core.messages import (
    TRUNCATED_STOP_REASONS,
    ModelClient,
    ModelRequest,
    ModelResponse,
)
from tooltrail.core.pricing import ModelPrice, estimate_cost
from tooltrail.core.results import Part
from tooltrail.core.text import encodable_call, render_text
from tooltrail.core.wire import (
    MODEL_TURN,
    ModelTurnOutcome,
    ModelTurnRequest,
    SessionState,
    TurnPlan,
)
from tooltrail.db.model_calls import ModelCall, record_model_call
from tooltrail.db.reachability import unreachable
from tooltrail.db.store import (
    append_messages,
    load_conversation,
    load_session_state,
    store_answer,
)
from tooltrail.llm.errors import MODEL_OUTPUT_TRUNCATED, to_application_error
from tooltrail.pipeline.directory import PeerOffer, RegistryDirectory
from tooltrail.telemetry import chat_span, provider_name

__all__ = ["MODEL_CALL_WRITE_WAIT_S", "ConversationActivities"]

log = logging.getLogger("tooltrail.model")

MODEL_CALL_WRITE_WAIT_S = 10.0
"""Longest a model call's record waits for an unreachable database before it is dropped
(logged): the answer, or the failure Temporal retries, goes on without it."""


class ConversationActivities:
    """Runs the model phase of turns against the host's model client."""

    def __init__(
        self,
        client: ModelClient,
        recorder: Recorder,
        planner: TurnPlanner | None = None,
        catalog: Callable[[], list[dict[str, Any]]] | None = None,
        directory: RegistryDirectory | None = None,
        prices: dict[str, ModelPrice] | None = None,
    ) -> None:
        """Wire the model client and the audit recorder (whose database holds conversations).

        Args:
            client: the model client.
            recorder: the audit recorder (its database holds the conversations).
            planner: plans the answer's tool calls (the worker's tools, verdicts).
            catalog: the worker's tool catalog (OpenAI format); the model is offered the
                turn's advertised tools of it. Built once, at the first model turn: the
                worker's registry is frozen by then (``build_worker``), and a schema costs a
                millisecond to generate.
            directory: the registries of the worker's task queue: the model is offered the
                tools of the queue's live peers too (``tooltrail.pipeline.directory``), and the
                plan advertises them, so whichever worker runs a model call the model sees
                the same tools, and its calls of a peer's tool are sent to the peer.
            prices: the operator's price table (``TOOLTRAIL_MODEL_PRICES``), by model name:
                each model call's record carries its estimated cost.
        """
        self.client = client
        self.prices = prices or {}
        self.directory = directory
        self.recorder = recorder
        self.planner = planner
        self._built_catalog: list[dict[str, Any]] | None = None
        self.catalog = catalog

    @activity.defn(name=MODEL_TURN)
    async def model_turn(self, inp: ModelTurnRequest) -> ModelTurnOutcome:
        """Store the new messages, ask the model (unless already answered), store the answer.

        The answer comes with the worker's plan of its tool calls, and the session's saved
        state (read with the conversation) in the plan.

        Raises:
            ApplicationError: (non-retryable) an interactive turn while the workers of the
                queue disagree on approvers (``TurnPlanner.agree_on_approvers``).
        """
        if inp.interactive and self.planner is not None:
            await self.planner.agree_on_approvers()
        phase = inp.phase
        answer_seq = phase.start_seq + len(phase.new_messages)

        async def load() -> tuple[list[Any], SessionState | None]:
            async with self.recorder.store.sessions.begin() as session:
                await append_messages(
                    session,
                    run_id=phase.run_id,
                    start_seq=phase.start_seq,
                    messages=phase.new_messages,
                )
                stored = await load_conversation(session, run_id=phase.run_id, up_to=answer_seq)
                state = (
                    None
                    if inp.session_id is None
                    else await load_session_state(session, session_id=inp.session_id)
                )
            return stored, state

        # An outage before the model call waits here (heartbeating), not in Temporal's
        # bounded retries: an agent run outlives a database outage.
        async with heartbeating(at_once=False):
            stored, state = await until_written(
                load, what=f"reading the conversation of run {phase.run_id!r}"
            )
        peers = await self._peer_offer()
        previous = next((answer for seq, _, answer in stored if seq == answer_seq), None)
        if previous is not None:
            return ModelTurnOutcome(
                response=_for_history(previous),
                reused=True,
                plan=self._plan(inp, previous, state, peers),
            )
        messages = [message for seq, message, _ in stored if seq < answer_seq]
        refs = [m.content_ref for m in messages if m.content_ref]
        if refs:
            # Large tool results stayed out of history; the model reads them in full.
            blobs = await self.recorder.store.blobs(refs)
            messages = [
                m.model_copy(update={"content": render_text(_output(blobs[m.content_ref]))})
                if m.content_ref in blobs
                else m
                for m in messages
            ]
        request = ModelRequest(
            messages=messages,
            tools=self._catalog(inp, peers),
            model=phase.settings.model,
            temperature=phase.settings.temperature,
            max_tokens=phase.settings.max_tokens,
            thinking=phase.settings.thinking,
            prompt_caching=phase.settings.prompt_caching,
        )
        call = _CallRecord(self, inp, request, seq=answer_seq)
        try:
            with chat_span(
                self.client,
                model=request.model,
                temperature=request.temperature,
                max_tokens=request.max_tokens,
                session_id=inp.session_id,
            ) as span:
                async with heartbeating(at_once=False):
                    response = await self.client.complete(request)
                span.finish(
                    input_tokens=response.usage.input_tokens,
                    output_tokens=response.usage.output_tokens,
                    finish_reason=response.stop_reason,
                    response_id=response.raw_id,
                )
        except asyncio.CancelledError:
            await call.failed(
                "Cancelled", "the model call was cancelled (timed out or the turn cancelled)"
            )
            raise
        except Exception as exc:
            failure = to_application_error(exc)
            await call.failed(failure.type or type(exc).__name__, failure.message)
            raise failure from exc
        try:
            _refuse_truncated(response, request)
        except ApplicationError as truncated:
            await call.write(call.answered(response, error=(truncated.type, truncated.message)))
            raise
        response = _encodable_calls(response)
        record = call.answered(response)
        sessions = self.recorder.store.sessions

        async def store(with_record: bool = True) -> None:
            async with sessions.begin() as session:
                await store_answer(session, run_id=phase.run_id, seq=answer_seq, response=response)
                if with_record:
                    # In the answer's transaction: the record costs no round trip of its own.
                    await record_model_call(session, call=record, created_at=datetime.now(UTC))

        # The model answered (a paid, non-deterministic call): with the database down, hold
        # the answer and retry until it lands instead of failing the run or asking again.
        what = f"storing the model's answer of run {phase.run_id!r}"
        try:
            await until_written(store, what=what)
        except Exception:
            # Refused for good (not an outage): the answer goes on without its record.
            log.warning("the model call record of %s was refused; dropped", what, exc_info=True)
            await until_written(lambda: store(with_record=False), what=what)
        return ModelTurnOutcome(
            response=_for_history(response), plan=self._plan(inp, response, state, peers)
        )

    async def _peer_offer(self) -> PeerOffer:
        """What the queue's live peers add to this worker's tools (bounded; see the directory)."""
        if self.directory is None:
            return PeerOffer({}, [])
        return await self.directory.peer_offer()

    def _catalog(self, inp: ModelTurnRequest, peers: PeerOffer) -> list[dict[str, Any]]:
        if self.catalog is None:
            return []
        if self._built_catalog is None:
            self._built_catalog = self.catalog()
        offered = self._built_catalog
        if peers.catalog:
            own = {_spec_name(spec) for spec in offered}
            extra = [spec for spec in peers.catalog if _spec_name(spec) not in own]
            # The union sorted by name: whichever worker runs the call, the model is offered
            # the same list in the same order (its own entries win a name clash).
            offered = sorted([*offered, *extra], key=_spec_name)
        wanted = None if inp.advertised is None else set(inp.advertised)
        return [spec for spec in offered if wanted is None or _spec_name(spec) in wanted]

    def _plan(
        self,
        inp: ModelTurnRequest,
        response: ModelResponse,
        state: SessionState | None,
        peers: PeerOffer,
    ) -> TurnPlan:
        # Agent turns do not memoize (they never did): their plans carry no memo plan.
        calls = response.message.tool_calls
        plan = (
            TurnPlan()
            if self.planner is None
            else self.planner.plan(
                calls,
                advertised=inp.advertised,
                parallel=inp.verdicts and bool(calls),
                memo=False,
                # The union the model was offered: a call of a peer's tool is dispatched
                # (and sent to the peer), not answered "not available".
                peer_tools=peers.tools,
            )
        )
        if state is not None:
            plan.session = state
        return plan


class _CallRecord:
    """The ``model_call`` row of one attempt: started when the model is asked."""

    def __init__(
        self,
        owner: ConversationActivities,
        inp: ModelTurnRequest,
        request: ModelRequest,
        *,
        seq: int,
    ) -> None:
        info = activity.info()
        default = getattr(owner.client, "model", None)
        model = request.model or (default if isinstance(default, str) else None)
        self.owner = owner
        self.model = model
        self.base: dict[str, Any] = {
            "turn_id": inp.turn_id,
            "temporal_run_id": info.workflow_run_id or "",
            "run_id": inp.phase.run_id,
            "seq": seq,
            "attempt": info.attempt,
            "provider": provider_name(owner.client) or type(owner.client).__name__,
            "model": model,
            "request_sha256": request_digest(request),
        }
        self.started_at = datetime.now(UTC)
        self.started = time.monotonic()

    async def failed(self, error_type: str, error: str) -> None:
        """Record an attempt that got no answer."""
        await self.write(self._call(error_type=error_type, error=error))

    def answered(
        self, response: ModelResponse, *, error: tuple[str | None, str] | None = None
    ) -> ModelCall:
        """The record of an answer (with the error it is refused for, if any: a cut-off one)."""
        usage = response.usage
        return self._call(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            stop_reason=str(response.stop_reason),
            cost_usd=estimate_cost(self.owner.prices, self.model, usage),
            error_type=None if error is None else error[0],
            error=None if error is None else error[1],
        )

    def _call(self, **outcome: Any) -> ModelCall:
        latency_ms = round((time.monotonic() - self.started) * 1000)
        return ModelCall(**self.base, started_at=self.started_at, latency_ms=latency_ms, **outcome)

    async def write(self, call: ModelCall) -> None:
        """Write the record on its own, waiting a bounded time for the database."""
        store = self.owner.recorder.store

        async def write() -> None:
            async with store.sessions.begin() as session:
                await record_model_call(session, call=call, created_at=datetime.now(UTC))

        # Shielded: a cancelled attempt still gets its row (the wait is bounded either way).
        task = asyncio.ensure_future(_bounded(write, what=f"model call of turn {call.turn_id!r}"))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await task
            raise


async def _bounded(write: Callable[[], Any], *, what: str) -> None:
    """Write, retrying an unreachable database for ``MODEL_CALL_WRITE_WAIT_S``; never raise."""
    deadline = time.monotonic() + MODEL_CALL_WRITE_WAIT_S
    delay = 0.2
    while True:
        try:
            await write()
            return
        except Exception as exc:
            left = deadline - time.monotonic()
            if not unreachable(exc) or left <= 0:
                log.warning("the record of the %s was not written; dropped", what, exc_info=True)
                return
        await asyncio.sleep(min(delay, max(left, 0.0)))
        delay = min(delay * 2, 2.0)


def request_digest(request: ModelRequest) -> str:
    """SHA-256 of the request's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(
        request.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _refuse_truncated(response: ModelResponse, request: ModelRequest) -> None:
    """Fail for good on an answer cut off while it asked for tools, or before any text.

    Its tool calls may be incomplete (the last one's arguments cut in the middle), and
    asking again with the same budget would most likely cut it again.

    Raises:
        ApplicationError: ``ModelOutputTruncated``, not retryable.
    """
    if response.stop_reason not in TRUNCATED_STOP_REASONS:
        return
    message = response.message
    if not message.tool_calls and message.content.strip():
        return  # a text answer cut short is still an answer; its stop reason says so
    budget = "the context window" if response.stop_reason != "max_tokens" else "max_tokens"
    if request.max_tokens is not None and response.stop_reason == "max_tokens":
        budget = f"max_tokens={request.max_tokens}"
    if message.tool_calls:
        names = ", ".join(sorted({call.name for call in message.tool_calls}))
        what = f"in the middle of its tool calls ({names}); none of them was run"
    elif response.stop_reason == "max_tokens":
        what = "before it said anything (thinking may have used the whole budget)"
    else:
        what = "before it said anything"
    if response.stop_reason != "max_tokens":
        advice = "the conversation has outgrown the model's context window"
    else:
        advice = "raise ModelSettings.max_tokens"
        if isinstance(request.thinking, int):
            advice += " or lower its thinking budget"
    raise ApplicationError(
        f"the model's answer was cut off by {budget} {what}: {advice}",
        {"stop_reason": response.stop_reason, "output_tokens": response.usage.output_tokens},
        type=MODEL_OUTPUT_TRUNCATED,
        non_retryable=True,
    )


def _encodable_calls(response: ModelResponse) -> ModelResponse:
    """The answer, its tool-call arguments nested too deep as their JSON text.

    A provider that parses the arguments (Anthropic's ``input``) may hand over a mapping
    deeper than a payload or a JSON column carries: stored or returned as it is, it failed
    the activity after the model was paid, and the retry asked the model again. As text,
    the turn answers the call ``invalid arguments: nested deeper than 64 levels``.
    """
    calls = response.message.tool_calls
    encoded = [encodable_call(call) for call in calls]
    if all(new is old for new, old in zip(encoded, calls, strict=True)):
        return response
    return response.model_copy(
        update={"message": response.message.model_copy(update={"tool_calls": encoded})}
    )


def _spec_name(spec: dict[str, Any]) -> str:
    """The tool name of a catalog entry (OpenAI's ``tools`` format)."""
    return str(spec.get("function", {}).get("name", ""))


def _for_history(response: ModelResponse) -> ModelResponse:
    """The answer without its thinking blocks (they stay in the conversation in SQL)."""
    if not response.message.thinking:
        return response
    return response.model_copy(
        update={"message": response.message.model_copy(update={"thinking": []})}
    )


_OUTPUT = TypeAdapter(str | list[Part])


def _output(value: object) -> str | list[Part]:
    return _OUTPUT.validate_python(value)
