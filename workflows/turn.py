"""``TurnWorkflow``: one model turn's tool calls through the dispatch pipeline.

The turn's shell: it takes the calls (or asks the model for them), answers the ones that
cannot be dispatched, runs the others one by one or in waves, and ends the trail. Its parts
share one ``TurnState``: one call's pipeline is ``workflows.attempt``, the event stream and
its writes ``workflows.trail``, the reading of activity failures and cancellation
``workflows.failures``. Deterministic code only: every tool body, reflector, database write
and piece of user code runs in an activity.

Hard errors (``LoopDetected``, ``ToolRecoveryExhausted``) leave as non-retryable
``ApplicationError``s; cancellation leaves as ``asyncio.CancelledError`` so the workflow ends
*cancelled*. Either way the audit trail is written first.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from temporalio import workflow

from tooltrail.core.messages import Message, ModelResponse, Usage
from tooltrail.core.planner import CallVerdict, plan_waves
from tooltrail.core.results import ToolCall, ToolDispatchResult
from tooltrail.core.text import (
    QUOTE_CHARS,
    duplicate_call_id,
    invalid_arguments,
    nesting_exceeds,
    not_available,
    quoted,
    too_many_calls,
)
from tooltrail.core.wire import (
    TRAIL_HEAD_MEMO,
    ApprovalInput,
    ConversationAppend,
    ModelPhase,
    PendingApproval,
    TurnInput,
    TurnOutput,
    TurnRecord,
    TurnStatus,
)
from tooltrail.errors import TurnError
from tooltrail.workflows.approvals import approval_rejection, take_answer
from tooltrail.workflows.arguments import refused_arguments, refused_text
from tooltrail.workflows.attempt import CallPipeline
from tooltrail.workflows.failures import (
    application_error,
    raise_if_cancelled,
)
from tooltrail.workflows.planning import Planning
from tooltrail.workflows.state import TrailState, TurnState
from tooltrail.workflows.trail import Trail, json_size

__all__ = ["TurnWorkflow"]

_MAX_CALLS_PATCH = "tooltrail-max-calls"
"""Turns with more calls than ``RunConfig.max_calls`` answer them all without running any."""

_ANCHOR_MEMO_PATCH = "tooltrail-trail-anchor-memo"
"""Failed and cancelled turns anchor their trail's head in the memo (``TRAIL_HEAD_MEMO``)."""

_BOUNDED_ANSWERS_PATCH = "tooltrail-bounded-answers"
"""The answers the workflow makes itself (an unknown tool, a duplicate id, unusable arguments)
quote at most ``QUOTE_CHARS`` of a model-chosen name or id, and count toward the turn's
``inline_output_bytes``: a model can send any number of calls to a never-advertised tool with
a name of any length, and every answer stays in the turn's result and trail."""

_EVENT_INPUT_LIMIT = 64 * 1024
"""Bytes of a call's input recorded in its tool_call_received event before it is cut."""


def _parse_arguments(arguments: dict[str, Any] | str) -> dict[str, Any] | str:
    """Return the arguments as a dict, or the soft error text when raw JSON is unusable."""
    if isinstance(arguments, dict):
        return arguments
    if not arguments.strip():
        return {}
    too_deep = refused_text(arguments)
    if too_deep is not None:
        return too_deep
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError as exc:
        return invalid_arguments(f"not valid JSON ({exc.msg} at position {exc.pos})")
    except (ValueError, RecursionError) as exc:
        # Valid-looking JSON Python cannot take (a 5,000-digit number, extreme nesting).
        return invalid_arguments(f"not valid JSON ({type(exc).__name__}: {exc})"[:300])
    if not isinstance(parsed, dict):
        return invalid_arguments(f"expected a JSON object, got {type(parsed).__name__}")
    return parsed


def _safe_size(value: Any) -> int | None:
    if not isinstance(value, str) and nesting_exceeds(value):
        return None
    try:
        return json_size(value)
    except (ValueError, RecursionError, TypeError):  # UnicodeEncodeError is a ValueError
        return None


def _pre_answered(call: ToolCall, text: str) -> ToolDispatchResult:
    return ToolDispatchResult(
        tool_call_id=call.id,
        output=text,
        is_error=True,
        duration_ms=0.0,
        resolved_tool_name=call.name,
    )


@workflow.defn(name="TurnWorkflow")
class TurnWorkflow:
    """Runs one turn's tool calls and returns one result per call, in the model's order."""

    @workflow.init
    def __init__(self, inp: TurnInput) -> None:
        """Set up the turn's state, its trail and its call pipeline for this execution."""
        started = workflow.now()
        self._state = TurnState(
            input=inp,
            record=TurnRecord(
                turn_id=workflow.info().workflow_id,
                session_id=inp.session_id,
                started_at=started,
                call_count=len(inp.calls),
                rerun_of=inp.rerun_of,
                mode="shadow" if inp.shadow else ("rerun" if inp.rerun_of else "live"),
            ),
            trail=TrailState(last_write=started),
        )
        self._trail = Trail(self._state)
        self._calls = CallPipeline(self._state, self._trail)
        self._planning = Planning(self._state, self._trail)
        self._bounded: bool | None = None

    # -- interactive approvals -----------------------------------------------------------

    @workflow.update(name="approval")
    async def approval(self, answer: ApprovalInput) -> None:
        """Approve or deny a call parked on a hook's ``Ask``."""
        take_answer(self._state, answer)

    @approval.validator
    def _validate_approval(self, answer: ApprovalInput) -> None:
        reason = approval_rejection(self._state, answer)
        if reason is not None:
            raise ValueError(reason)

    @workflow.query(name="pending_approvals")
    def pending_approvals(self) -> list[PendingApproval]:
        """The calls waiting for a human, in the order they asked."""
        return list(self._state.waiting.values())

    # -- the turn ----------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: TurnInput) -> TurnOutput:
        """Dispatch every call; soft errors are results, hard errors fail the workflow."""
        state = self._state
        started = state.record.started_at
        results: list[ToolDispatchResult] = []
        response: ModelResponse | None = None
        tools_started = started
        try:
            if inp.model is None:
                # What only the worker knows (the tools, the session's state) comes first.
                state.adopt(await self._planning.prepare())
                self._started(started)
            else:
                # The model phase: its tool calls are this turn's calls, planned by the worker.
                response = await self._model_phase(inp.model, started)
                inp = state.input.model_copy(update={"calls": response.message.tool_calls})
                state.input = inp
                state.record = state.record.model_copy(update={"call_count": len(inp.calls)})
                tools_started = workflow.now()
            self._receive(inp.calls)
            results = await self._dispatch_batch(inp)
        except asyncio.CancelledError as cancelled:
            self._started(started)
            self._trail.emit(
                "turn_cancelled",
                {
                    "finished_calls": list(state.finished),
                    "pending_calls": [c.id for c in inp.calls if c.id not in state.finished],
                },
            )
            self._turn_end(started, [], success=False, error="cancelled")
            await self._finish("cancelled", cancelled)
            self._anchor()
            raise
        except TurnError as hard:
            self._started(started)
            # The batch's results are discarded; the audit trail keeps everything.
            self._turn_end(tools_started, [], success=False, error=str(hard))
            await self._finish("failed", hard)
            self._anchor()
            raise application_error(hard) from None
        usage = response.usage if response is not None else None
        if response is None or inp.calls:
            self._turn_end(tools_started, results, success=True, usage=usage)
        if inp.model is not None and results:
            # The results go to the conversation with the final record, after the answer.
            state.conversation = ConversationAppend(
                run_id=inp.model.run_id,
                start_seq=inp.model.start_seq + len(inp.model.new_messages) + 1,
                messages=[
                    Message.from_result(result, name=call.name)
                    for call, result in zip(inp.calls, results, strict=True)
                ],
            )
        await self._finish_recording()
        return TurnOutput(
            turn_id=state.record.turn_id,
            # An agent turn returns neither its results nor the session's state: the next
            # turn reads both from the database, and the run's history stays flat.
            results=[] if inp.model is not None else results,
            assistant=response.message if response is not None else None,
            usage=usage,
            stop_reason=response.stop_reason if response is not None else None,
            trail_head=self._trail.head,
        )

    def _started(self, at: datetime) -> None:
        """Emit ``turn_started`` (the turn's first event), unless it was emitted already."""
        if self._trail.started:
            return  # turn_started is always seq 0: nothing is emitted before it
        inp = self._state.input
        self._trail.emit(
            "turn_started",
            {
                "session_id": inp.session_id,
                "calls": len(inp.calls),
                "model_phase": inp.model is not None,
                "advertised": self._state.advertised,
                "config": inp.config.model_dump(mode="json"),
                # What a later shadow replay needs to start where this turn started.
                "detector": self._state.detector.model_dump(mode="json"),
                "rerun_of": inp.rerun_of,
                "shadow_of": inp.shadow.of_turn if inp.shadow else None,
            },
            at=at,
        )

    def _receive(self, calls: list[ToolCall]) -> None:
        # on_tool_call_received fires for every call, unknown ones included, before dispatch.
        for call in calls:
            payload: dict[str, Any] = {
                "turn": self._state.record.turn_id,
                "tool": call.name,
                "call_id": call.id,
                "input": call.arguments,
            }
            size = _safe_size(call.arguments)
            if size is None or size > _EVENT_INPUT_LIMIT:
                # The full input is in the turn's workflow input (history); the event keeps
                # a note of it so no audit write can outgrow a payload.
                payload["input"] = (
                    "<not encodable as JSON: kept in the turn's workflow input>"
                    if size is None
                    else f"<{size} bytes: kept in the turn's workflow input>"
                )
                payload["input_bytes"] = size
            self._trail.emit("tool_call_received", payload, call_id=call.id, tool=call.name)

    def _turn_end(
        self,
        started: datetime,
        results: list[ToolDispatchResult],
        *,
        success: bool,
        error: str | None = None,
        usage: Usage | None = None,
        phase: str = "tools",
    ) -> None:
        # Two per model turn with tools (spec §8): the LLM phase, then the tool phase, with
        # durations that do not overlap and the same token counts (tools spend none).
        payload: dict[str, Any] = {
            "phase": phase,
            "success": success,
            "error": error,
            "duration_ms": (workflow.now() - started).total_seconds() * 1000.0,
            "results": [result.model_dump(mode="json") for result in results],
        }
        if usage is not None:
            payload.update(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
        self._trail.emit("turn_end", payload)

    async def _model_phase(self, phase: ModelPhase, started: datetime) -> ModelResponse:
        """Ask the model for the turn's calls; the worker plans them with its answer."""
        outcome = await self._planning.ask_model(phase)
        self._started(started)  # the turn's first event, now that the detector is known
        response = outcome.response
        self._trail.emit(
            "model_response",
            {
                "run_id": phase.run_id,
                "text": response.message.content,
                "tool_calls": [c.model_dump(mode="json") for c in response.message.tool_calls],
                "stop_reason": response.stop_reason,
                "usage": response.usage.model_dump(mode="json"),
                "reused": outcome.reused,
            },
        )
        self._turn_end(started, [], success=True, usage=response.usage, phase="llm")
        return response

    async def _finish(self, status: TurnStatus, error: BaseException | None = None) -> None:
        """End the trail: the session's state as the turn leaves it, then the final write."""
        inp = self._state.input
        # An agent run ends with the turn whose model answered without tool calls (or with
        # its last allowed turn, which the run marks ends_run).
        answered = inp.model is not None and status == "completed" and not inp.calls
        if inp.ends_run or answered:
            # The run is over: a pattern at stop level must not stop the session's next run.
            self._state.end_of_run()
        await self._trail.finish(status, error)

    def _anchor(self) -> None:
        """Anchor the trail's head in the memo: the anchor of a turn that returns no result.

        A completed turn's head rides in its result; a failed or cancelled one has none, so
        its head goes where SQL cannot rewrite it either, once the final write has landed:
        one memo upsert per such turn, nothing per call. Its payload goes through the data
        converter (and the codec) like the result, so ``verify`` reads it back the same way.
        """
        head = self._trail.head
        if head and workflow.patched(_ANCHOR_MEMO_PATCH):
            workflow.upsert_memo({TRAIL_HEAD_MEMO: head})

    async def _finish_recording(self) -> None:
        # Every call has its result: a cancellation arriving now cannot change the outcome,
        # so it must not cost the audit trail its final write.
        for _ in range(3):
            try:
                await self._finish("completed")
                return
            except asyncio.CancelledError:
                workflow.logger.info("cancellation after the last result; completing the turn")
        await self._finish("completed")

    # -- the batch and its waves --------------------------------------------------------------

    async def _dispatch_batch(self, inp: TurnInput) -> list[ToolDispatchResult]:
        """Answer unknown and malformed calls, dispatch the batch, fill slots in call order."""
        finished = self._state.finished
        advertised = set(self._state.advertised)
        slots: list[ToolDispatchResult | None] = [None] * len(inp.calls)
        batch: list[tuple[int, ToolCall, dict[str, Any]]] = []
        seen: set[str] = set()
        limit = inp.config.max_calls
        if len(inp.calls) > limit and workflow.patched(_MAX_CALLS_PATCH):
            # Too many for one history (a model's runaway answer): nothing runs, and every
            # call says why, so the model can split the work.
            text = too_many_calls(len(inp.calls), limit)
            for call in inp.calls:
                finished.append(call.id)
            return [_pre_answered(call, text) for call in inp.calls]
        for position, call in enumerate(inp.calls):
            if call.id in seen:
                # Results pair with calls by id: a second call with the same id could not be
                # told apart from the first, so only the first one runs.
                slots[position] = self._answer(call, duplicate_call_id, call.id)
                continue
            seen.add(call.id)
            if call.name not in advertised:
                # Never advertised: answered before dispatch, no events, no activity.
                slots[position] = self._answer(call, not_available, call.name)
                finished.append(call.id)
                continue
            arguments = _parse_arguments(call.arguments)
            if isinstance(arguments, str):
                slots[position] = self._answer(call, arguments)
                finished.append(call.id)
                continue
            problem = refused_arguments(arguments, inp.config.max_argument_bytes)
            if problem is not None:
                slots[position] = self._answer(call, problem)
                finished.append(call.id)
                continue
            batch.append((position, call, arguments))
        if inp.config.dispatch == "parallel" and len(batch) >= 2:
            await self._dispatch_waves(inp, batch, slots)
        else:
            # Sequential (spec §9.2): the first hard error aborts; later calls never start.
            for position, call, arguments in batch:
                raise_if_cancelled()
                slots[position] = await self._calls.dispatch(call, arguments)
                finished.append(call.id)
        return [
            slot
            if slot is not None
            else _pre_answered(inp.calls[position], "dispatch produced no result")
            for position, slot in enumerate(slots)
        ]

    def _answer(
        self,
        call: ToolCall,
        text: str | Callable[[str, int | None], str],
        name: str = "",
    ) -> ToolDispatchResult:
        """A call answered by the workflow itself: ``text``, or ``text(name, cut)``.

        Bounded and counted toward the turn's inline output budget (``_BOUNDED_ANSWERS_PATCH``):
        ``name`` is quoted up to ``QUOTE_CHARS``, and past the budget not at all (the answer
        says only how long it was).
        """
        if self._bounded is None:
            self._bounded = workflow.patched(_BOUNDED_ANSWERS_PATCH)
        if isinstance(text, str):
            whole = cut = bare = text
        else:
            whole, cut, bare = text(name, None), text(name, QUOTE_CHARS), text(name, 0)
        if not self._bounded:
            return _pre_answered(call, whole)
        state = self._state
        answer = cut
        if json_size(cut) > state.input.config.inline_output_bytes - state.inline_used:
            answer = min(cut, bare, key=json_size)
        state.inline_used += json_size(answer)
        result = _pre_answered(call, answer)
        result.resolved_tool_name = quoted(call.name)
        return result

    async def _dispatch_waves(
        self,
        inp: TurnInput,
        batch: list[tuple[int, ToolCall, dict[str, Any]]],
        slots: list[ToolDispatchResult | None],
    ) -> None:
        """Parallel dispatch (spec §9.3): waves in order, calls of a wave concurrently."""
        verdicts = self._state.plan.verdicts or []
        plan = plan_waves(
            [
                verdicts[position] if position < len(verdicts) else CallVerdict()
                for position, _call, _arguments in batch
            ]
        )
        # One limit shared by every wave, bounded by the batch; granted first in, first out.
        permits = asyncio.Semaphore(max(1, min(inp.config.max_concurrency, len(batch))))

        async def run(call: ToolCall, arguments: dict[str, Any]) -> ToolDispatchResult:
            async with permits:
                result = await self._calls.dispatch(call, arguments)
            self._state.finished.append(call.id)
            return result

        for wave in plan:
            raise_if_cancelled()
            tasks = [asyncio.create_task(run(batch[i][1], batch[i][2])) for i in wave]
            try:
                await workflow.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            except asyncio.CancelledError:
                # The turn was cancelled: stop the wave's calls and let them settle first.
                await self._cancel_and_settle(tasks)
                raise
            if any(task.done() and not task.cancelled() and task.exception() for task in tasks):
                await self._cancel_and_settle(tasks)
                # The earliest hard error in wave order wins; siblings we cancelled don't count.
                for task in tasks:
                    error = None if task.cancelled() else task.exception()
                    if error is not None and not isinstance(error, asyncio.CancelledError):
                        raise error
            for index, task in zip(wave, tasks, strict=True):
                slots[batch[index][0]] = task.result()

    @staticmethod
    async def _cancel_and_settle(tasks: list[asyncio.Task[ToolDispatchResult]]) -> None:
        for task in tasks:
            if not task.done():
                task.cancel()
        await workflow.wait(tasks)
