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
"""

from __future__ import annotations

import logging
from collections.abc import Callable
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
from tooltrail.core.results import Part
from tooltrail.core.text import render_text
from tooltrail.core.wire import (
    MODEL_TURN,
    ModelTurnOutcome,
    ModelTurnRequest,
    SessionState,
    TurnPlan,
)
from tooltrail.db.store import (
    append_messages,
    load_conversation,
    load_session_state,
    store_answer,
)
from tooltrail.llm.errors import MODEL_OUTPUT_TRUNCATED, to_application_error
from tooltrail.pipeline.directory import PeerOffer, RegistryDirectory
from tooltrail.telemetry import chat_span

__all__ = ["ConversationActivities"]

log = logging.getLogger("tooltrail.model")


class ConversationActivities:
    """Runs the model phase of turns against the host's model client."""

    def __init__(
        self,
        client: ModelClient,
        recorder: Recorder,
        planner: TurnPlanner | None = None,
        catalog: Callable[[], list[dict[str, Any]]] | None = None,
        directory: RegistryDirectory | None = None,
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
        """
        self.client = client
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
        except Exception as exc:
            raise to_application_error(exc) from exc
        _refuse_truncated(response, request)

        async def store() -> None:
            async with self.recorder.store.sessions.begin() as session:
                await store_answer(session, run_id=phase.run_id, seq=answer_seq, response=response)

        # The model answered (a paid, non-deterministic call): with the database down, hold
        # the answer and retry until it lands instead of failing the run or asking again.
        await until_written(store, what=f"storing the model's answer of run {phase.run_id!r}")
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
